# frozen_string_literal: true

require "test_helper"
require "memkit/metrics"

class MetricsRecorderTest < Minitest::Test
  Recorder = Memkit::Metrics::Recorder
  Store = Memkit::Metrics::Store

  # The hook, in a forked worker: its record is there at once, under the
  # index it was given, naming the master it was given.
  def test_worker_booted_writes_the_record_at_once
    Dir.mktmpdir do |dir|
      r, w = IO.pipe
      child = fork do
        r.close
        Memkit::Metrics.worker_booted(4, master: Process.ppid, dir: dir)
        w.write("x")
        sleep
      end
      w.close
      r.read(1)
      record = Store.new(dir).read.fetch(child)
      assert_equal({ role: "worker", worker: 4, master: Process.pid },
                   record.slice(:role, :worker, :master))
      assert_operator record.fetch(:gc_minor) + record.fetch(:gc_major), :>=, 0
      assert_equal ["worker-4"], Dir.children(dir)
    ensure
      Process.kill(:KILL, child) if child
      Process.wait(child) if child
    end
  end

  def test_bad_hook_arguments
    assert_raises(Memkit::InvalidArgument) { Memkit::Metrics.worker_booted(-1, master: Process.pid) }
    assert_raises(Memkit::InvalidArgument) { Memkit::Metrics.worker_booted(1, role: :boss, master: Process.pid) }
    assert_raises(Memkit::InvalidArgument) { Recorder.new(->(_) {}, interval: -1) }
  end

  # The middleware writes after the reply (rack.after_reply), at most once
  # per interval, and a failure to write is logged once and never reaches
  # the request.
  def test_middleware_writes_after_the_reply_once_per_interval
    Dir.mktmpdir do |dir|
      in_child do
        app = Recorder.new(->(_env) { [200, {}, ["ok"]] }, interval: 3600, dir: dir, logger: nil)
        hooks = []
        status, = app.call("rack.after_reply" => hooks)
        raise "status #{status}" unless status == 200
        raise "wrote before the reply" unless Dir.children(dir).empty?

        hooks.each(&:call)
        first = Store.new(dir).read.fetch(Process.pid)
        GC.start
        hooks = []
        app.call("rack.after_reply" => hooks)
        hooks.each(&:call)
        second = Store.new(dir).read.fetch(Process.pid)
        raise "wrote again within the interval" unless second == first
      end

      in_child do
        log = StringIO.new
        blocked = File.join(dir, "file")
        File.write(blocked, "")
        app = Recorder.new(->(_env) { [200, {}, ["ok"]] }, dir: File.join(blocked, "sub"), logger: log, interval: 0)
        3.times do
          hooks = []
          app.call("rack.after_reply" => hooks)
          hooks.each(&:call)
        end
        raise "expected one log line, got #{log.string.inspect}" unless log.string.lines.size == 1 && log.string.include?("left out of scrapes")
      end
    end
  end

  private

  # Recorder keeps process-wide state: each case runs in a fork of its own.
  def in_child(&block)
    r, w = IO.pipe
    pid = fork do
      r.close
      block.call
      w.write("ok")
    rescue Exception => e # anything at all, reported to the parent
      w.write("#{e.class}: #{e.message}")
    ensure
      w.close
      exit!(0)
    end
    w.close
    result = r.read
    Process.wait(pid)
    assert_equal "ok", result
  end
end
