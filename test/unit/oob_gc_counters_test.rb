# frozen_string_literal: true

require "test_helper"
require "memkit/oob_gc"

# The process counters' "never silent" part: the reason OobGC cannot keep
# GC out of requests goes to the log once per process, and stays in stats
# only while it holds. Each test runs in a forked child: the counters are
# process-wide.
class OobGCCountersTest < Minitest::Test
  Counters = Memkit::OobGC::Counters

  class FailingPolicy < Memkit::OobGC::Policy.detect
    def observe(*) = raise(ArgumentError, "broken policy")
  end

  def test_gives_up_aloud_once
    in_child do
      lines = []
      log = ->(line) { lines << line }
      Counters.give_up("heap too small", log)
      Counters.give_up("heap too small", log)
      assert_equal "heap too small", Counters.stats.gave_up
      assert_equal ["memkit: OobGC in worker #{Process.pid} cannot keep GC out of requests: heap too small"], lines
      Counters.recovered
      assert_nil Counters.stats.gave_up
      Counters.give_up("again", log)
      assert_equal "again", Counters.stats.gave_up
      assert_equal 1, lines.size, "once per process"
    end
  end

  # GC runs inside requests while given up are counted as watched.
  def test_counts_gc_runs_inside_requests_while_given_up
    in_child do
      Counters.give_up("test", nil)
      Counters.enter
      GC.start
      Counters.leave
      stats = Counters.stats
      assert_equal 1, stats.inside_major
      assert_equal 1, stats.watched
    end
  end

  # A collector that fails once the response is out (where servers drop
  # what is raised) says so like any other reason, once, and leaves the
  # process idle for the next request.
  def test_a_collector_that_fails_says_so_once
    in_child do
      lines = []
      collector = Memkit::OobGC::Collector.new(policy: FailingPolicy, log: ->(line) { lines << line })
      2.times { assert_equal 0, collector.finished(collector.started) }
      assert_equal 0, collector.out_of_band
      assert Counters.idle?
      assert_match(/\AArgumentError: broken policy \(.+:\d+:in /, Counters.stats.gave_up)
      assert_equal 1, lines.size
      assert_match(/cannot keep GC out of requests: ArgumentError: broken policy/, lines.first)
    end
  end

  private

  # Runs the block in a forked child; its failures fail this test.
  def in_child
    reader, writer = IO.pipe
    pid = fork do
      reader.close
      begin
        yield
        writer.write("ok")
      rescue Minitest::Assertion, StandardError => e
        writer.write("#{e.class}: #{e.message}")
      end
      writer.close
      exit!(0)
    end
    writer.close
    result = reader.read
    Process.wait(pid)
    assert_equal "ok", result
  end
end
