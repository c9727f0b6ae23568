# frozen_string_literal: true

require "test_helper"
require "memkit/cgroup"

class CgroupTest < Minitest::Test
  FIXTURES = File.expand_path("../fixtures/cgroup", __dir__)

  def fixture(name) = Memkit::Cgroup.read(root: File.join(FIXTURES, name))

  # A container with its own cgroup namespace: the limit is on "/".
  def test_v2_container_reads_limit_usage_and_events
    r = fixture("v2-container")
    assert_equal 2, r.version
    assert_equal 536_870_912, r.limit
    assert_nil r.high # "max"
    assert_equal 421_527_552, r.usage
    assert_equal 73_924_608, r.inactive_file
    assert_equal 421_527_552 - 73_924_608, r.working_set
    assert_in_delta (421_527_552 - 73_924_608).fdiv(536_870_912), r.used_ratio, 1e-9
    assert_equal({ "low" => 0, "high" => 0, "max" => 17, "oom" => 2, "oom_kill" => 1, "oom_group_kill" => 0 }, r.events)
    assert r.limited?
    assert r.limit.is_a?(Integer) && r.usage.is_a?(Integer)
  end

  # Kubernetes on a v2 host: the container's own cgroup says "max", the pod
  # above it has the limit, and the smallest on the way up is the one enforced.
  def test_v2_nested_takes_the_smallest_limit_on_the_way_up
    r = fixture("v2-nested")
    assert_equal 1_073_741_824, r.limit
    assert_equal 966_367_641, r.high
    assert r.limited_at.end_with?("/kubepods.slice/kubepods-pod42.slice"), r.limited_at
    assert r.path.end_with?("cri-containerd-ab12.scope"), r.path
    assert_equal 650_117_120, r.usage
    assert_equal 3, r.events.fetch("high")
  end

  def test_v2_without_a_limit_anywhere_is_unlimited
    r = fixture("v2-unlimited")
    refute r.limited?
    assert_nil r.limit
    assert_nil r.used_ratio
    assert_equal 123_456_789, r.usage
    assert_equal 0, r.inactive_file # no memory.stat in the leaf
  end

  def test_v2_garbage_is_a_parse_error_naming_the_file
    error = assert_raises(Memkit::ParseError) { fixture("v2-garbage") }
    assert_match %r{memory\.max: expected a number of bytes, got "lots"}, error.message
    assert_kind_of Memkit::Error, error
  end

  def test_no_memory_controller_is_not_found
    error = assert_raises(Memkit::Cgroup::NotFound) { fixture("v2-no-memory") }
    assert_match(/no memory cgroup for pid self/, error.message)
    assert_kind_of Memkit::Error, error
    assert_raises(Memkit::Cgroup::NotFound) { Memkit::Cgroup.read(root: File.join(FIXTURES, "no-such-tree")) }
  end

  # A hybrid host (v2 mounted without the memory controller): v1 is read, and
  # v1's "no limit" (the largest page-aligned long) on the root is no limit.
  def test_v1_in_a_hybrid_tree
    r = fixture("v1-limited")
    assert_equal 1, r.version
    assert_equal 805_306_368, r.limit
    assert_equal 402_653_184, r.usage
    assert_equal 20_971_520, r.inactive_file
    assert_equal({ "failcnt" => 5, "oom_kill" => 1 }, r.events)
    assert_nil r.high
  end

  # This machine runs cgroup v1: the real files, read as the kernel has them.
  def test_v1_on_this_machine
    line = File.read("/proc/self/cgroup").lines.find { |l| l.split(":")[1].to_s.split(",").include?("memory") }
    skip "this machine has no cgroup v1 memory controller (/proc/self/cgroup)" unless line

    r = Memkit::Cgroup.read
    assert_equal 1, r.version
    assert r.path.end_with?(line.chomp.split(":", 3)[2].chomp("/")), "#{r.path} vs #{line}"
    raw_limit = Integer(File.read(File.join(r.path, "memory.limit_in_bytes")))
    if raw_limit >= Memkit::Cgroup::UNLIMITED_FROM && r.limit.nil?
      refute r.limited?
    else
      assert_operator r.limit, :<=, raw_limit
    end
    # Usage moves; it is a positive Integer near what the file says now.
    usage = Integer(File.read(File.join(r.path, "memory.usage_in_bytes")))
    assert_kind_of Integer, r.usage
    assert_operator r.usage, :>, 0
    assert_in_delta usage, r.usage, [usage, r.usage].max / 2
    # Another process in the same cgroup reads the same directory.
    with_children(1) { |pids| assert_equal r.path, Memkit::Cgroup.read(pids.first).path }
  end

  def test_a_missing_process_is_no_such_process
    assert_raises(Memkit::NoSuchProcess) { Memkit::Cgroup.read(4_194_304 + 7) }
  end
end
