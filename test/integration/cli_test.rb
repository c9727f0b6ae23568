# frozen_string_literal: true

require "test_helper"
require "json"
require "stringio"
require "memkit/cli"
require "support/server_tree"

class CLITest < Minitest::Test
  def run_cli(*argv)
    out = StringIO.new
    err = StringIO.new
    status = Memkit::CLI.new(out: out, err: err).run(argv.map(&:to_s))
    [out.string, err.string, status]
  end

  def dead_pid
    pid = fork { exit!(0) }
    Process.wait(pid)
    pid
  end

  def test_stat_json_contract
    out, err, status = run_cli("stat", Process.pid, "--json")
    assert_equal [0, ""], [status, err]
    json = JSON.parse(out)
    assert_equal Process.pid, json.fetch("pid")
    %w[rss pss uss shared_clean shared_dirty private_clean private_dirty swap].each do |key|
      assert_kind_of Integer, json.fetch(key), key
    end
  end

  def test_stat_table
    out, _, status = run_cli("stat", Process.pid)
    assert_equal 0, status
    assert_match(/^pss\s+\S+ \S+\s+\d+$/, out)
  end

  def test_smaps_summary_with_shared_percentage
    out, _, status = run_cli("smaps", Process.pid)
    assert_equal 0, status
    %w[size rss pss shared_clean shared_dirty private_clean private_dirty swap].each do |field|
      assert_match(/^  #{field}\s+[\d,]+ kB$/, out)
    end
    assert_match(/is shared \(\d+(\.\d)?%\)/, out)
    json = JSON.parse(run_cli("smaps", Process.pid, "--json").first)
    assert_operator json.fetch("size"), :>=, json.fetch("rss")
    assert_kind_of Float, json.fetch("shared_pct")
  end

  def test_tree_json_contract_and_table
    ServerTree.run(workers: 2, heap_strings: 50_000) do |master|
      out, err, status = run_cli("tree", master, "--json")
      assert_equal [0, ""], [status, err]
      json = JSON.parse(out)
      assert_equal master, json.fetch("root")
      assert_equal 3, json.fetch("processes").size
      %w[rss pss uss].each do |key|
        assert_equal json["processes"].sum { |p| p.fetch(key) }, json.fetch("total").fetch(key)
      end
      json["processes"].each do |p|
        %w[pid ppid command rss pss uss shared_clean shared_dirty private_dirty swap].each { |k| assert p.key?(k), k }
      end

      table, = run_cli("tree", master, "--sort", "uss")
      assert_match(/^\s*total\s+3 processes/, table)
      assert_equal 1, table.scan(/^\s*#{master}\s/).size

      # The tree against its container: the memory cgroup the master runs in.
      cgroup = Memkit::Cgroup.read(master)
      assert_equal cgroup.path, json.fetch("container").fetch("path")
      assert_match(/^container: .*cgroup v#{cgroup.version} #{Regexp.escape(cgroup.path)}/, table)
    rescue Memkit::Cgroup::NotFound
      assert_nil json.fetch("container")
    end
  end

  def test_maps
    out, _, status = run_cli("maps", Process.pid)
    assert_equal 0, status
    assert_match(/^libraries\s/, out)
    json = JSON.parse(run_cli("maps", Process.pid, "--json").first)
    assert_equal Memkit::Mappings::KINDS.keys.map(&:to_s), json.fetch("kinds").keys
  end

  def test_usage_errors_exit_2_with_one_line
    [%w[frob], %w[stat], %w[stat abc], %w[tree 1 2], %w[stat 1 --bogus], %w[tree 1 --sort size],
     %w[tree 1 --watch 0], %w[bench nope]].each do |argv|
      out, err, status = run_cli(*argv)
      assert_equal 2, status, argv.inspect
      assert_equal 1, err.lines.size, "#{argv.inspect}: #{err}"
      assert_match(/\Amemkit: /, err)
      assert_equal "", out
    end
  end

  def test_runtime_failures_exit_1_naming_the_pid
    pid = dead_pid
    %w[stat smaps tree maps].each do |command|
      _, err, status = run_cli(command, pid)
      assert_equal 1, status, command
      assert_equal "memkit: no such process: pid #{pid}\n", err
    end
  end

  def test_debug_adds_the_backtrace
    _, err, status = run_cli("stat", dead_pid, "--debug")
    assert_equal 1, status
    assert_operator err.lines.size, :>, 2
    assert_match(%r{lib/memkit/}, err)
  end

  def test_help_and_version
    out, _, status = run_cli("--help")
    assert_equal 0, status
    Memkit::CLI::COMMANDS.each_key { |command| assert_includes out, command }
    assert_equal ["memkit #{Memkit::VERSION}\n", "", 0], run_cli("--version")
    assert_equal 2, run_cli.last, "no command is a usage error"
    out, _, status = run_cli("tree", "--help")
    assert_equal 0, status
    assert_includes out, "--watch SECONDS"
  end

  # The real executable: exit codes, one line on stderr, no backtrace.
  def test_the_executable
    out, err, status = memkit("stat", Process.pid, "--json")
    assert status.success?, err
    assert_equal Process.pid, JSON.parse(out)["pid"]
    _, err, status = memkit("tree", "not-a-pid")
    assert_equal [2, "memkit: not a pid: \"not-a-pid\" (see memkit tree --help)\n"], [status.exitstatus, err]
  end

  # --watch redraws until Ctrl-C, and Ctrl-C ends it cleanly.
  def test_watch_stops_cleanly_on_interrupt
    stdin, stdout, stderr, wait = Open3.popen3(RbConfig.ruby, EXE, "tree", Process.pid.to_s, "--watch", "0.1")
    stdin.close
    # Each redraw reads this test process's whole tree: on a loaded machine
    # two took more than 10 s.
    wait_until(timeout: 60, message: "two redraws") { (@seen = (@seen || +"") << stdout.readpartial(4096)).scan(/^\s*total/).size >= 2 }
    Process.kill(:INT, wait.pid)
    status = wait.value
    assert_equal 0, status.exitstatus
    assert_equal "", stderr.read
  ensure
    [stdout, stderr].each { |io| io&.close }
  end

  # kthreadd (pid 2) is alive but a kernel thread: no user memory, said so.
  def test_tree_stat_and_maps_of_a_kernel_thread_say_it_has_no_user_memory
    skip "pid 2 is not kthreadd here (a pid namespace?)" unless File.exist?("/proc/2/comm") && File.read("/proc/2/comm") == "kthreadd\n"

    out, err, status = run_cli("stat", 2)
    assert_equal [0, ""], [status, err]
    assert_match(/\Apid 2 \[kthreadd\]: a kernel thread, no user memory$/, out)
    assert_match(/^rss\s+0 B\s+0$/, out)
    assert_equal true, JSON.parse(run_cli("stat", 2, "--json").first).fetch("kernel_thread")

    out, err, status = run_cli("tree", 2)
    assert_equal [0, ""], [status, err]
    assert_match(/^\s*2\s+0\s+\[kthreadd\]/, out)
    assert_match(/^kernel threads have no user memory \(all figures 0\): 2 \[kthreadd\]/, out)
    refute_match(/no such process/, out + err)

    out, err, status = run_cli("cow", 2)
    assert_equal ["", "memkit: pid 2 (kthreadd) is a kernel thread: it has no user memory to share\n", 1],
                 [out, err, status]
    root = JSON.parse(run_cli("tree", 2, "--json").first).fetch("processes").first
    assert_equal [2, true, 0], root.values_at("pid", "kernel_thread", "rss")

    out, err, status = run_cli("maps", 2)
    assert_equal ["pid 2 [kthreadd]: a kernel thread, no user memory\n", "", 0], [out, err, status]
  end

  def test_soak_of_a_directory_says_it_is_one
    Dir.mktmpdir do |dir|
      _, err, status = run_cli("soak", dir)
      assert_equal 2, status
      assert_equal "memkit: #{dir} is a directory, not a config.ru (see memkit soak --help)\n", err
    end
  end
end
