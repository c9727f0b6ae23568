# frozen_string_literal: true

require "test_helper"
require "memkit/metrics"

class MetricsStoreTest < Minitest::Test
  Store = Memkit::Metrics::Store

  def setup
    @tmp = Dir.mktmpdir("memkit-store")
    @store = Store.new(File.join(@tmp, "server"))
  end

  def teardown
    FileUtils.rm_rf(@tmp)
  end

  def test_round_trip
    @store.write({ pid: Process.pid, role: :worker, worker: 0, gc_minor: 12, oobgc_seconds: 1.5e-05 })
    record = @store.read.fetch(Process.pid)
    assert_equal({ pid: Process.pid, role: "worker", worker: 0, gc_minor: 12, oobgc_seconds: 1.5e-05,
                   start: Store.start_time(Process.pid) }, record)
    assert_equal 0o700, File.stat(@store.dir).mode & 0o777
  end

  # A replacement writes its predecessor's file: one record per index.
  def test_a_worker_index_has_one_record_and_a_dead_writer_none
    with_children(2) do |(first, second)|
      @store.write({ pid: first, role: :worker, worker: 1, gc_minor: 1 })
      assert_equal [first], @store.read.keys
      @store.write({ pid: second, role: :worker, worker: 1, gc_minor: 2 })
      assert_equal [second], @store.read.keys
      assert_equal ["worker-1"], Dir.children(@store.dir)
    end
    dead = fork { exit!(0) }
    Process.wait(dead)
    @store.write({ pid: dead, role: :child, start: 1 })
    assert_empty @store.read
    # pid-N names are removed once their writer is gone; worker-N wait for the successor.
    assert_equal ["worker-1"], Dir.children(@store.dir)
  end

  # A pid reused by another process has another start time.
  def test_a_reused_pid_is_not_taken_for_its_writer
    @store.write({ pid: Process.pid, role: :worker, worker: 0, start: Store.start_time(Process.pid) - 1 })
    assert_empty @store.read
  end

  def test_missing_directory_and_bad_files
    assert_empty Store.new(File.join(@tmp, "nothing")).read
    @store.write({ pid: Process.pid, role: :master })
    File.write(File.join(@store.dir, "worker-7"), "not a record\n")
    File.write(File.join(@store.dir, "other"), "pid #{Process.pid}\n")
    assert_equal [Process.pid], @store.read.keys
    assert_raises(Memkit::InvalidArgument) { Store.new("") }
  end

  def test_refuses_a_directory_it_does_not_own
    skip "needs root to make a directory another user owns" unless Process.uid.zero?

    dir = File.join(@tmp, "memkit-metrics-0")
    Dir.mkdir(dir)
    File.chown(65_534, 65_534, dir)
    error = assert_raises(Memkit::Error) { Store.new(File.join(dir, "1")).write({ pid: Process.pid }) }
    assert_match(/not a directory owned by uid 0/, error.message)
  end
end
