# frozen_string_literal: true

require "test_helper"
require "memkit/metrics"

class MetricsUnitTest < Minitest::Test
  Exposition = Memkit::Metrics::Exposition

  # Reads label sets back the way the text format defines them.
  def parse_labels(text)
    pairs = {}
    text.scan(/(\w+)="((?:[^"\\]|\\.)*)"/m) do |key, value|
      pairs[key] = value.gsub(/\\(.)/m) { Regexp.last_match(1) == "n" ? "\n" : Regexp.last_match(1) }
    end
    pairs
  end

  def test_label_values_round_trip_through_escaping
    random = Random.new(Integer(ENV.fetch("FUZZ_SEED", Random.new_seed % 1_000_000)))
    500.times do
      value = Array.new(random.rand(0..20)) { [random.rand(0..31), 34, 92, 10, 127, random.rand(32..126)].sample(random: random).chr }.join
      value += random.bytes(random.rand(0..3)) if random.rand(3).zero?
      text = Exposition.new.gauge("x", "help", [[{ command: value }, 1]]).to_s
      line = text.lines.last
      assert_equal 1, text.count("\n") - 2, "one sample line for #{value.inspect}:\n#{text}"
      assert line.valid_encoding?
      expected = value.dup.force_encoding(Encoding::UTF_8).scrub("?")
      assert_equal expected, parse_labels(line[/\{.*\}/m])["command"], value.inspect
    end
  end

  def test_numbers_and_empty_families
    assert_equal "", Exposition.new.gauge("x", "h", []).to_s
    assert_equal "0.5", Exposition.number(0.5)
    assert_equal "0.0", Exposition.number(0.0)
    assert_equal "1.5e-07", Exposition.number(1.5e-7)
    assert_equal "12", Exposition.number(12)
    assert_equal "+Inf", Exposition.number(Float::INFINITY)
    assert_equal "NaN", Exposition.number(Float::NAN)
  end

  # Real forked children titled as a server titles them: role and worker
  # labels come from the titles, a second claim on an index adds the pid,
  # and a process the server does not name is a child with its pid.
  def test_labels_from_titles_and_records
    skip "no /proc/PID/smaps_rollup" unless linux?

    titles = ["unicorn worker[0] -c x", "unicorn worker[1] -c x", "unicorn worker[1] -c x", "sh -c sleep"]
    Dir.mktmpdir do |dir|
      with_children(4, child: ->(i) { Process.setproctitle(titles[i]) }) do |pids|
        Memkit::Metrics::Store.new(dir).write({ pid: pids[1], role: :worker, worker: 1, gc_minor: 7, gc_major: 1 })
        text = Memkit::Metrics.render(Process.pid, dir: dir, gc: true)
        rows = text.scan(/^memkit_process_info\{(.*)\} 1$/).map { |(l)| parse_labels(l) }
        by_pid = rows.to_h { |r| [r.fetch("pid").to_i, r] }
        assert_equal "master", by_pid.fetch(Process.pid)["role"]
        assert_equal({ "role" => "worker", "worker" => "0" }, by_pid.fetch(pids[0]).slice("role", "worker"))
        # pids[1] wrote the record for index 1, so it holds the plain label set.
        assert_match(/^memkit_process_rss_bytes\{role="worker",worker="1"\} \d+$/, text)
        assert_match(/^memkit_process_rss_bytes\{role="worker",worker="1",pid="#{pids[2]}"\} \d+$/, text)
        assert_match(/^memkit_process_rss_bytes\{role="child",pid="#{pids[3]}"\} \d+$/, text)
        assert_match(/^memkit_gc_runs_total\{role="worker",worker="1",kind="minor"\} 7$/, text)
        assert_match(/^memkit_gc_runs_total\{role="master",kind="major"\} \d+$/, text)
        refute_match(/^memkit_gc_runs_total\{role="worker",worker="0"/, text, "worker 0 keeps no record")
        ratios = text.scan(/^memkit_worker_shared_with_master_ratio\{(.*)\} ([\d.]+)$/)
        assert_equal 3, ratios.size
        ratios.each { |_, v| assert_operator v.to_f, :>, 0 }
        assert_equal 5, text[/^memkit_tree_processes (\d+)$/, 1].to_i
        assert_equal 5, text.scan(/^memkit_allocator_info\{/).size
        sets = text.lines.grep_v(/^#/).map { |l| l[/\A[^ ]+/] }
        assert_equal sets.uniq, sets, "no two samples share a name and label set"
      end
    end
  end

  def test_a_tree_that_is_gone_is_reported_down_and_logged_once
    pid = fork { exit!(0) }
    Process.wait(pid)
    log = StringIO.new
    metrics = Memkit::Metrics.new(root: pid, logger: log)
    3.times { assert_match(/^memkit_target_up 0$/, metrics.render) }
    assert_match(/^# memkit: no such process: pid #{pid}$/, metrics.render)
    refute metrics.check
    assert_equal ["memkit metrics: no such process: pid #{pid}; serving memkit_target_up 0\n"], log.string.lines
  end

  def test_container_reading_is_exported_when_given
    skip "no /proc/PID/smaps_rollup" unless linux?

    text = Memkit::Metrics.render(Process.pid, container: -> { { limit: 1 << 30, usage: nil } })
    assert_match(/^memkit_container_memory_limit_bytes 1073741824$/, text)
    refute_match(/memkit_container_memory_usage_bytes/, text)
    assert_raises(Memkit::InvalidArgument) { Memkit::Metrics.new(container: 5) }
    assert_raises(Memkit::InvalidArgument) { Memkit::Metrics.new(root: "x") }
  end
end
