# frozen_string_literal: true

require "test_helper"
require "logger"
require "stringio"
require "memkit/refork/puma"
require "memkit/refork/pitchfork"

# The adapters against real processes and the real /proc, without a server:
# a forked "master" with the shape Puma's fork_worker gives (master -> worker 0
# -> workers), and the test process standing in for a Pitchfork worker.
class ReforkAdaptersTest < Minitest::Test
  MIB = 1_048_576

  def setup
    skip "needs Linux /proc" unless linux?
  end

  # master -> worker 0 -> 2 workers that each write `grow` bytes of their own.
  # Yields the master's pid and a reader that gets "refork" when the master
  # receives SIGUSR1.
  def with_fork_worker_tree(grow:)
    r, w = IO.pipe
    master = fork do
      r.close
      Process.setpgid(0, 0)
      trap(:USR1) { w.syswrite("refork\n") }
      fork do
        2.times do
          fork do
            keep = "x" * grow # written in full: grow bytes of private pages
            w.syswrite("ready\n")
            sleep
            keep.clear
          end
        end
        sleep
      end
      sleep
    end
    w.close
    2.times { assert_equal "ready\n", r.gets }
    yield master, r
  ensure
    reap(-master, master) if master
  end

  def test_puma_watcher_reads_the_grandchildren_and_signals_the_master
    with_fork_worker_tree(grow: 24 * MIB) do |master, signals|
      log = StringIO.new
      logger = Object.new
      # growth: 0.01, so the threshold is min_growth whatever the size of the
      # test process the tree was forked from.
      logger.define_singleton_method(:log) { |s| log.puts(s) }
      watcher = Memkit::Refork::PumaWatcher.new(master_pid: master, signal: :USR1, log: logger,
                                                policy: Memkit::Refork::Policy.new(min_growth: 16 * MIB, growth: 0.01))
      readings = watcher.readings
      assert_equal 2, readings.size, "the two workers forked by worker 0, not worker 0 itself"
      tree = Memkit.tree(master)
      worker0 = tree.nodes.find { |n| n.depth == 1 }
      readings.each do |r|
        assert_operator r.uss_growth, :>=, 24 * MIB, "each wrote 24 MiB of its own"
        assert_in_delta worker0.memory.rss, r.parent_rss, 4 * MIB, "the parent is worker 0"
        assert_nil r.requests
      end

      assert_equal :confirming, watcher.check(now: 0).reason
      decision = watcher.check(now: 5)
      assert decision.refork?
      assert_equal "refork\n", signals.gets, "the master got the signal"
      assert_match(/memkit: refork \(growth\).*SIGUSR1 to #{master}/, log.string)
      assert_equal :cooldown, watcher.check(now: 10).reason
    end
  end

  def test_puma_watcher_leaves_workers_that_have_not_drifted
    with_fork_worker_tree(grow: 1 * MIB) do |master, signals|
      watcher = Memkit::Refork::PumaWatcher.new(master_pid: master, signal: :USR1)
      3.times { |i| refute watcher.check(now: i * 5).refork? }
      assert_equal :healthy, watcher.last_decision.reason
      assert_nil signals.wait_readable(0.2), "no signal"
    end
  end

  # SIGKILL to target (a pid, or minus a process group), then wait for pid.
  def reap(target, pid)
    Process.kill(:KILL, target)
    Process.wait(pid)
  rescue Errno::ESRCH, Errno::ECHILD
    nil
  end

  FakeWorker = Struct.new(:requests_count, :outdated) do
    def outdated? = outdated
  end

  def fake_server
    log = StringIO.new
    server = Struct.new(:logger).new(Logger.new(log))
    [server, log]
  end

  # The test process plays the worker; a child traps USR2 for the monitor.
  def test_pitchfork_worker_judges_itself_and_signals_the_monitor
    r, w = IO.pipe
    monitor = fork do
      r.close
      trap(:USR2) { w.syswrite("usr2\n") }
      sleep
    end
    w.close
    server, log = fake_server
    policy = Memkit::Refork::Policy.new(growth: 0.01, min_growth: 8 * MIB, confirm: 1, min_requests: 10)
    adapter = Memkit::Refork::Pitchfork.new(policy: policy, every: 4, monitor_pid: monitor, warmup: false)
    adapter.after_mold_fork(server, nil)
    adapter.after_worker_fork(server, nil)
    refute_match(/heap prepared/, log.string, "warmup: false leaves the mold alone")

    assert_equal :healthy, adapter.after_request_complete(server, FakeWorker.new(12, false)).reason
    keep = "y" * (16 * MIB) # this worker's own growth since after_worker_fork
    assert_nil adapter.after_request_complete(server, FakeWorker.new(7, false)), "checks every 4 requests only"
    assert_equal :cold, adapter.after_request_complete(server, FakeWorker.new(8, false)).reason
    assert_nil adapter.after_request_complete(server, FakeWorker.new(12, true)), "outdated: a newer mold exists"

    decision = adapter.after_request_complete(server, FakeWorker.new(12, false))
    assert decision.refork?, decision.to_s
    assert_operator decision.growth, :>=, 16 * MIB
    assert_equal "usr2\n", r.gets
    assert_match(/memkit: refork \(growth\).*SIGUSR2 to #{monitor}/, log.string)
    assert_equal :cooldown, adapter.after_request_complete(server, FakeWorker.new(16, false)).reason
    keep.clear
  ensure
    reap(monitor, monitor) if monitor
  end

  def test_adapters_reject_bad_options_by_name
    { every: 0, warmup: 1 }.each do |key, value|
      error = assert_raises(Memkit::InvalidArgument) { Memkit::Refork::Pitchfork.new(key => value) }
      assert_match(/\A#{key}:/, error.message)
    end
    error = assert_raises(Memkit::InvalidArgument) { Memkit::Refork::PumaWatcher.new(interval: 0) }
    assert_match(/\Ainterval:/, error.message)
  end
end
