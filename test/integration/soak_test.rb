# frozen_string_literal: true

require "test_helper"
require "json"
require "pty"
require "stringio"
require "memkit/cli"
require "support/servers"

# `memkit soak` end to end: real processes, real config.ru files, a real
# Unicorn on 127.0.0.1 for the URL mode.
class SoakTest < Minitest::Test
  FIXTURES = File.join(Memkit::TestHelpers::ROOT, "test", "fixtures", "soak")

  def fixture(name) = File.join(FIXTURES, name)

  def test_json_for_a_config_ru_has_samples_fit_and_verdict
    Dir.mktmpdir do |dir|
      csv = File.join(dir, "leak.csv")
      # 20,000 requests: the 400 B/request leak is found within them, and
      # sized within 25% (the issue's bar), on every Ruby.
      out, err, status = memkit("soak", fixture("leak.ru"), "--requests", "20000", "--sample-every", "125",
                                "--warmup", "1000", "--json", "--csv", csv, "--no-attribute")
      assert status.success?, err
      assert_empty err, "no progress bar when stderr is not a terminal"
      r = JSON.parse(out)
      assert_equal 20_000, r["requests"]
      assert_equal 161, r["samples"].size
      assert_equal (0..20_000).step(125).to_a, r["samples"].map { |s| s["requests"] }
      assert_equal "leak", r["verdict"], r["reason"]
      assert_in_delta 400, r["bytes_per_request"], 100
      assert_equal %w[rss live], r["verdicts"].keys
      assert_match(/mallinfo2|jemalloc|malloc_increase/, r["malloc_source"])
      assert r["samples"].all? { |s| s["rss"].positive? && s["heap_live_slots"].positive? }
      lines = File.readlines(csv)
      assert_equal "requests,seconds,rss,heap_live_slots,heap_live_bytes,malloc_bytes,gc\n", lines.first
      assert_equal 162, lines.size
      assert_equal [], Dir.children(dir) - ["leak.csv"], "no temporary files left"
    end
  end

  def test_text_output_has_the_plot_verdict_and_attribution
    out, err, status = memkit("soak", fixture("leak_objects.ru"), "--requests", "5000", "--sample-every", "50",
                              "--fail-on-leak")
    assert_equal 3, status.exitstatus, "--fail-on-leak: #{err}"
    assert_match(/^verdict: leak: grows \d+ B\/request/, out)
    assert_match(/^bytes_per_request: \d+/, out)
    assert_match(/\|\s*\*+/, out, "terminal plot")
    assert_match(%r{leak_objects\.ru:9\s+Hash}, out, "allocation site of the retained Hash")
  end

  def test_progress_bar_with_eta_only_on_a_terminal
    output = +""
    PTY.spawn(RbConfig.ruby, EXE, "soak", fixture("churn.ru"), "--requests", "1500", "--sample-every", "25",
              "--no-attribute", "--fail-on-leak") do |r, _w, pid|
      begin
        r.each_char { |c| output << c }
      rescue Errno::EIO
        nil # the child closed the terminal
      end
      Process.wait(pid)
      assert_equal 0, $?.exitstatus, "a plateau passes --fail-on-leak"
    end
    assert_match(%r{\[#*\.*\]\s+\d+% \d+/1500 .*ETA \d+:\d\d}, output)
    assert_match(/verdict: plateau/, output)
  end

  def test_missing_file_is_a_usage_error_and_writes_nothing
    Dir.mktmpdir do |dir|
      csv = File.join(dir, "out.csv")
      plot = File.join(dir, "out.svg")
      out, err, status = memkit("soak", File.join(dir, "nope.ru"), "--csv", csv, "--plot", plot)
      assert_equal 2, status.exitstatus
      assert_empty out
      assert_equal 1, err.lines.size, err
      assert_match(/no such file: .*nope\.ru/, err)
      assert_empty Dir.children(dir)
    end
  end

  def test_syntax_error_in_config_ru_is_one_line_and_exit_1
    Dir.mktmpdir do |dir|
      plot = File.join(dir, "out.html")
      File.write(plot, "previous report")
      out, err, status = memkit("soak", fixture("syntax_error.ru"), "--plot", plot)
      assert_equal 1, status.exitstatus
      assert_empty out
      assert_equal 1, err.lines.size, err
      assert_match(/syntax_error\.ru: syntax error/, err)
      assert_equal "previous report", File.read(plot), "an old report is not overwritten by a failed run"
      assert_equal ["out.html"], Dir.children(dir)
    end
  end

  def test_an_app_that_raises_mid_run_names_the_request_and_writes_nothing
    Dir.mktmpdir do |dir|
      ru = File.join(dir, "flaky.ru")
      File.write(ru, "n = 0\nrun ->(env) { n += 1; raise KeyError, 'no session' if n == 150; [200, {}, ['ok']] }\n")
      csv = File.join(dir, "out.csv")
      out, err, status = memkit("soak", ru, "--requests", "400", "--csv", csv, "--plot", File.join(dir, "out.svg"))
      assert_equal 1, status.exitstatus
      assert_empty out
      assert_equal ["memkit: flaky.ru: the app raised on request 150: KeyError: no session\n"], err.lines
      assert_equal ["flaky.ru"], Dir.children(dir)
    end
  end

  def test_url_without_pid_and_url_nobody_listens_on
    port = free_port
    Dir.mktmpdir do |dir|
      csv = File.join(dir, "x.csv")
      _, err, status = memkit("soak", "http://127.0.0.1:#{port}/", "--csv", csv)
      assert_equal 2, status.exitstatus
      assert_equal 1, err.lines.size, err
      assert_match(/is a URL: pass the server's pid in --pid \(see memkit soak --help\)$/, err)

      _, err, status = memkit("soak", "http://127.0.0.1:#{port}/", "--pid", Process.pid, "--csv", csv)
      assert_equal 1, status.exitstatus
      assert_equal 1, err.lines.size, err
      assert_match(/nothing listens on 127\.0\.0\.1:#{port}/, err)

      _, err, status = memkit("soak", "http://127.0.0.1:#{port}/", "--pid", Process.pid, "--compare", "a2:MALLOC_ARENA_MAX=2")
      assert_equal 2, status.exitstatus
      assert_match(/--compare needs a config.ru target/, err)

      _, err, status = memkit("soak", "http://example.com/", "--pid", Process.pid)
      assert_equal 2, status.exitstatus
      assert_match(/only drives servers on 127\.0\.0\.1/, err)
      assert_empty Dir.children(dir)
    end
  end

  def test_without_the_rack_gem_a_config_ru_is_one_clear_line
    env = { "RUBYOPT" => nil, "BUNDLE_GEMFILE" => nil, "GEM_PATH" => "/nonexistent/memkit-gems", "GEM_HOME" => "/nonexistent/memkit-gems" }
    out, err, status = Open3.capture3(env, RbConfig.ruby, "--disable-gems", EXE, "soak", fixture("leak.ru"), "--requests", "100")
    assert_equal 1, status.exitstatus, err
    assert_empty out
    assert_equal ["memkit: soaking leak.ru needs the rack gem (add it to your Gemfile, or soak a URL with --pid)\n"], err.lines
  end

  def test_bad_options_are_usage_errors
    [["--requests", "0"], ["--sample-every", "5000"], ["--warmup", "20000"], ["--plot", "/tmp/x.png"],
     ["--compare", "nonsense"], ["--compare", "je:LD_PRELOAD=/nonexistent/libjemalloc.so"],
     ["--concurrency", "8"], ["--csv", "/nonexistent-dir/x.csv"]].each do |args|
      # In this process (the CLI's own entry point): these fail before any
      # request, and eight Ruby boots would be most of this file's time.
      out = StringIO.new
      err = StringIO.new
      status = Memkit::CLI.new(out: out, err: err).run(["soak", fixture("leak.ru"), "--requests", "1000", *args])
      assert_equal 2, status, "#{args.inspect}: #{err.string}"
      assert_empty out.string
      assert_equal 1, err.string.lines.size, "#{args.inspect}: #{err.string}"
    end
  end

  def test_url_mode_samples_a_unicorn_tree_over_keep_alive
    Dir.mktmpdir do |dir|
      server = Memkit::ServersHelper.start_server(:unicorn, File.read(fixture("leak.ru")), dir: dir, port: free_port, workers: 2)
      begin
        out, err, status = memkit("soak", "http://127.0.0.1:#{server.port}/", "--pid", server.pid, "--requests", "2000",
                                  "--sample-every", "100", "--concurrency", "2", "--json")
        assert status.success?, err
        r = JSON.parse(out)
        assert_equal "url", r["mode"]
        assert_equal server.pid, r["pid"]
        assert_equal 21, r["samples"].size
        workers = Memkit.tree(server.pid).nodes.size
        assert_equal 3, workers, "master and two workers"
        # The whole tree is sampled: more than the master alone.
        assert_operator r["samples"].last["rss"], :>, Memkit.rss(server.pid) * 2
        assert_equal 0, r["http_errors"]
        refute r["samples"].first.key?("heap_live_slots"), "no heap figures from outside the process"
      ensure
        Memkit::ServersHelper.stop_server(server)
      end
    end
  end
end
