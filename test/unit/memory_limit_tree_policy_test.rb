# frozen_string_literal: true

require "test_helper"

class MemoryLimitTreePolicyTest < Minitest::Test
  MB = 1 << 20
  FIXTURES = File.expand_path("../fixtures/cgroup", __dir__)

  def policy(limit = 1000 * MB) = Memkit::MemoryLimit::TreePolicy.new(limit: limit)

  def test_under_the_limit_nobody_goes
    workers = { 11 => 300 * MB, 12 => 200 * MB }
    assert_nil policy.decide(tree_pss: 1000 * MB, workers: workers, me: 11)
    assert_nil policy.decide(tree_pss: 900 * MB, workers: workers, me: 12)
  end

  def test_over_the_limit_only_the_largest_worker_goes
    workers = { 11 => 200 * MB, 12 => 350 * MB, 13 => 300 * MB }
    reason = policy.decide(tree_pss: 1001 * MB, workers: workers, me: 12)
    assert_match(/tree pss 1001\.0 MiB > limit 1000\.0 MiB; this worker is the largest of 3 \(uss 350\.0 MiB; others 300\.0 MiB, 200\.0 MiB\)/, reason)
    assert_nil policy.decide(tree_pss: 1001 * MB, workers: workers, me: 11)
    assert_nil policy.decide(tree_pss: 1001 * MB, workers: workers, me: 13)
  end

  # Every worker decides alone from its own reading: with equal sizes they
  # must still agree on one.
  def test_a_tie_goes_to_the_lower_pid_in_every_worker
    workers = { 30 => 100 * MB, 20 => 100 * MB, 40 => 90 * MB }
    decisions = workers.keys.to_h { |pid| [pid, policy.decide(tree_pss: 2000 * MB, workers: workers, me: pid)] }
    assert_equal [20], decisions.compact.keys
  end

  # The largest has gone and its replacement starts small: still over, the
  # next largest goes; a worker missing from the reading never acts.
  def test_after_the_largest_is_replaced_the_next_largest_goes
    before = { 11 => 200 * MB, 12 => 350 * MB, 13 => 300 * MB }
    after = before.merge(12 => 40 * MB)
    assert policy.decide(tree_pss: 1200 * MB, workers: before, me: 12)
    assert policy.decide(tree_pss: 1100 * MB, workers: after, me: 13)
    assert_nil policy.decide(tree_pss: 1100 * MB, workers: after, me: 99)
  end

  def test_limit_must_be_positive_bytes
    assert_raises(Memkit::InvalidArgument) { policy(0) }
    assert_raises(Memkit::InvalidArgument) { policy("80%") }
  end

  def app(**options) = Memkit::MemoryLimit.new(->(_env) { [200, {}, ["ok"]] }, **options)

  # "%" limits are shares of the container's memory limit.
  def test_percent_limits_come_from_the_cgroup
    limit = 536_870_912 # test/fixtures/cgroup/v2-container memory.max
    m = app(max_tree_pss: "80%", cgroup: File.join(FIXTURES, "v2-container"))
    assert_equal (limit * 0.8).round, m.max_tree_pss
    m = app(max_uss: "12.5 %", cgroup: File.join(FIXTURES, "v2-container"))
    assert_equal limit / 8, m.max_uss
    reading = Memkit::Cgroup::Reading.new(version: 2, path: "/x", limit: 1000, usage: 1, events: {})
    assert_equal 500, app(max_tree_pss: "50%", cgroup: reading).max_tree_pss
    assert_equal 300 * MB, app(max_tree_pss: "300MB").max_tree_pss
  end

  def test_percent_limits_without_a_container_limit_are_refused
    error = assert_raises(Memkit::InvalidArgument) { app(max_tree_pss: "80%", cgroup: File.join(FIXTURES, "v2-unlimited")) }
    assert_match(/max_tree_pss: "80%" is a share of the container's memory limit, and the memory cgroup .* has none/, error.message)
    error = assert_raises(Memkit::InvalidArgument) { app(max_tree_pss: "80%", cgroup: File.join(FIXTURES, "v2-no-memory")) }
    assert_match(/max_tree_pss: a "%" limit needs a memory cgroup/, error.message)
    assert_raises(Memkit::InvalidArgument) { app(max_tree_pss: "0%", cgroup: File.join(FIXTURES, "v2-container")) }
    assert_raises(Memkit::InvalidArgument) { app(max_tree_pss: "120%", cgroup: File.join(FIXTURES, "v2-container")) }
    assert_raises(Memkit::InvalidArgument) { app(max_tree_pss: "1GB", tree_check_interval: -1) }
  end
end
