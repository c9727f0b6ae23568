# frozen_string_literal: true

require "test_helper"
require "json"

# `require "memkit/fork"` changes fork for the whole process, so every case
# runs in a fresh Ruby: the other test files keep a plain fork, and each case
# starts from a heap memkit has never prepared.
class ForkTest < Minitest::Test
  # Loaded by every script: memkit/fork, a heap with enough new objects to
  # need preparing, and helpers the scripts report with.
  PRELUDE = <<~RUBY
    require "memkit/fork"
    require "json"
    $kept = Array.new(50_000) { Object.new }
    def report_line = JSON.generate(Memkit::Fork.last_report&.to_h)
    def say(obj) = ($stdout.puts(JSON.generate(obj)); $stdout.flush)
  RUBY

  def run_script(code, timeout: 30)
    out, err, status = Timeout.timeout(timeout) do
      Open3.capture3(RbConfig.ruby, "-I", File.join(ROOT, "lib"), "-e", PRELUDE + code)
    end
    lines = out.lines.map { |l| JSON.parse(l, symbolize_names: true) }
    [lines, err, status]
  end

  def assert_prepared(report, message = nil)
    refute_nil report, "the fork hook did not run #{message}"
    refute report[:skipped], "the fork hook skipped the warmup #{message}: #{report.inspect}"
    assert report[:young_after] < report[:young_before], report.inspect
  end

  def test_fork_with_block_prepares_and_keeps_exit_status
    lines, err, status = run_script(<<~RUBY)
      pid = fork { say(child: report_line); exit 7 }
      Process.wait(pid)
      say(status: $?.exitstatus, pid_class: pid.class.name)
    RUBY
    assert status.success?, err
    assert_prepared JSON.parse(lines[0][:child], symbolize_names: true)
    assert_equal({ status: 7, pid_class: "Integer" }, lines[1])
  end

  def test_fork_without_block_returns_nil_in_the_child
    lines, err, status = run_script(<<~RUBY)
      if (pid = fork)
        Process.wait(pid)
        say(status: $?.exitstatus)
      else
        say(child: report_line, nil_in_child: pid.nil?)
        exit!(5)
      end
    RUBY
    assert status.success?, err
    assert lines[0][:nil_in_child]
    assert_prepared JSON.parse(lines[0][:child], symbolize_names: true)
    assert_equal 5, lines[1][:status]
  end

  def test_process_fork_and_kernel_fork_are_prepared
    %w[Process.fork Kernel.fork].each do |call|
      lines, err, status = run_script(<<~RUBY)
        pid = #{call} { say(child: report_line) }
        Process.wait(pid)
        say(status: $?.exitstatus)
      RUBY
      assert status.success?, "#{call}: #{err}"
      assert_prepared JSON.parse(lines[0][:child], symbolize_names: true), call
      assert_equal 0, lines[1][:status]
    end
  end

  def test_io_popen_dash_is_prepared
    lines, err, status = run_script(<<~RUBY)
      io = IO.popen("-")
      if io.nil?
        say(child: report_line)
        exit!(0)
      end
      $stdout.write(io.read)
      io.close
      say(status: $?.exitstatus)
    RUBY
    assert status.success?, err
    assert_prepared JSON.parse(lines[0][:child], symbolize_names: true)
    assert_equal 0, lines[1][:status]
  end

  # Process.daemon forks and exits the parent, so it is called in a child;
  # the daemon reports over a pipe it inherits.
  def test_process_daemon_in_a_child_is_prepared
    lines, err, status = run_script(<<~RUBY)
      r, w = IO.pipe
      pid = fork(cow_friendly: false) do
        r.close
        $more = Array.new(50_000) { Object.new } # new objects since the last warmup
        Process.daemon(true, true)
        w.puts(JSON.generate(daemon: report_line, pid: Process.pid, parent: Process.ppid))
        w.close
        exit!(0)
      end
      w.close
      Process.wait(pid)
      say(status: $?.exitstatus)
      $stdout.write(r.read)
    RUBY
    assert status.success?, err
    assert_equal 0, lines[0][:status], "the daemonizing child exits 0"
    daemon = JSON.parse(lines[1][:daemon], symbolize_names: true)
    assert_prepared daemon, "in Process.daemon"
  end

  def test_opt_outs_on_every_fork_spelling
    calls = ["fork(cow_friendly: false)", "fork(nakayoshi: false)", "Process.fork(cow_friendly: false)",
             "Process.fork(nakayoshi: false)", "Kernel.fork(cow_friendly: false)",
             "Memkit::Fork.without { fork }", "Memkit::Fork.without { IO.popen('-') }"]
    lines, err, status = run_script(<<~RUBY)
      GC.disable # so only a warmup can change GC.count
      #{calls.inspect}.each do |call|
        count = GC.count
        child = eval(call)
        if child.nil?
          exit!(0)
        end
        child.is_a?(IO) ? (child.read; child.close) : Process.wait(child)
        say(call: call, gc_runs: GC.count - count)
      end
      count = GC.count
      Process.wait(fork { exit!(0) })
      say(call: "fork", gc_runs: GC.count - count)
    RUBY
    assert status.success?, err
    calls.each_with_index { |call, i| assert_equal({ call: call, gc_runs: 0 }, lines[i]) }
    assert_operator lines.last[:gc_runs], :>, 0, "a plain fork after the opt-outs is prepared again"
  end

  def test_opt_out_is_not_inherited_by_forks_in_the_child
    lines, err, status = run_script(<<~RUBY)
      pid = fork(cow_friendly: false) do
        $more = Array.new(50_000) { Object.new }
        inner = fork { say(grandchild: report_line) }
        Process.wait(inner)
      end
      Process.wait(pid)
      say(status: $?.exitstatus)
    RUBY
    assert status.success?, err
    assert_prepared JSON.parse(lines[0][:grandchild], symbolize_names: true)
    assert_equal 0, lines[1][:status]
  end

  def test_gc_disabled_and_enabled_states_survive_fork
    lines, err, status = run_script(<<~RUBY)
      GC.disable
      Process.wait(fork { exit!(GC.enable ? 0 : 1) })
      disabled_child = $?.exitstatus
      disabled_parent = GC.enable
      Process.wait(fork { exit!(GC.disable ? 1 : 0) })
      say(disabled_child: disabled_child, disabled_parent: disabled_parent, enabled_child: $?.exitstatus,
          enabled_parent: !GC.disable)
    RUBY
    assert status.success?, err
    assert_equal({ disabled_child: 0, disabled_parent: true, enabled_child: 0, enabled_parent: true }, lines[0])
  end

  def test_exceptions_and_argument_errors_are_rubys_own
    lines, err, status = run_script(<<~RUBY)
      pid = fork { raise "boom in child" }
      Process.wait(pid)
      say(status: $?.exitstatus)
      say(error: (fork(1) rescue $!.class.name), private: respond_to?(:fork), kernel: Kernel.respond_to?(:fork))
    RUBY
    assert status.success?, err
    assert_equal 1, lines[0][:status]
    assert_match(/boom in child \(RuntimeError\)/, err)
    assert_equal({ error: "ArgumentError", private: false, kernel: true }, lines[1])
  end

  def test_a_failing_warmup_never_stops_fork
    lines, err, status = run_script(<<~RUBY)
      Memkit::Warmup.singleton_class.prepend(Module.new { def run(**) = raise(Memkit::Error, "broken heap") })
      2.times { Process.wait(fork { exit!(3) }); say(status: $?.exitstatus) }
    RUBY
    assert status.success?, err
    assert_equal [{ status: 3 }, { status: 3 }], lines
    assert_equal 1, err.scan("memkit/fork: heap warmup before fork failed").size, "warned once: #{err}"
    assert_match(/broken heap/, err)
  end

  # memkit/fork starts the malloc release inside its own _fork hook; the
  # first child must still get the release's thread.
  def test_the_first_child_gets_the_malloc_release_thread
    skip "no malloc_trim in this process" unless Memkit::Libc.malloc_trim?

    lines, err, status = run_script(<<~RUBY)
      pid = fork { say(threads: Thread.list.map(&:name)) }
      Process.wait(pid)
    RUBY
    assert status.success?, err
    assert_equal [{ threads: [nil, Memkit::MallocRelease::THREAD] }], lines
  end

  def test_fork_from_a_thread_while_others_run
    lines, err, status = run_script(<<~RUBY)
      busy = Thread.new { loop { Array.new(100) { +"garbage" } ; Thread.pass } }
      pid = Thread.new do
        fork { say(child: report_line, threads: Thread.list.map(&:name) - [Memkit::MallocRelease::THREAD]) }
      end.value
      Process.wait(pid)
      say(status: $?.exitstatus, busy_alive: busy.alive?)
      busy.kill
    RUBY
    assert status.success?, err
    assert_prepared JSON.parse(lines[0][:child], symbolize_names: true)
    assert_equal [nil], lines[0][:threads], "the forking thread, and memkit's own"
    assert_equal({ status: 0, busy_alive: true }, lines[1])
  end

  def test_no_double_work_after_an_explicit_warmup_and_between_forks
    lines, err, status = run_script(<<~RUBY)
      GC.disable
      Memkit.warmup
      count = GC.count
      3.times { Process.wait(fork { say(child: report_line) }) }
      say(gc_runs: GC.count - count)
    RUBY
    assert status.success?, err
    children = lines.first(3).map { |l| JSON.parse(l[:child], symbolize_names: true) }
    children.each { |r| assert r[:skipped], r.inspect }
    assert_equal({ gc_runs: 0 }, lines.last)
  end

  # The hook and an explicit call do the same work with the same options:
  # the first fork runs the whole sequence once, the later ones skip.
  def test_the_hook_runs_the_same_steps_as_an_explicit_warmup_once
    lines, err, status = run_script(<<~RUBY)
      explicit = Memkit.warmup(force: true).steps
      Memkit::Warmup.reset!
      $more = Array.new(50_000) { Object.new }
      reports = Array.new(3) do
        pid = fork { exit!(0) }
        Process.wait(pid)
        Memkit::Fork.last_report.to_h
      end
      say(explicit: explicit, hook: reports.map { |r| [r[:skipped], r[:steps]] }, runs: Memkit::Warmup.runs)
    RUBY
    assert status.success?, err
    result = lines.last
    # The release, once started by the explicit call, stays on: not a step again.
    assert_equal [false, result[:explicit] - ["malloc_release"]], result[:hook].first
    assert_equal [[true, []], [true, []]], result[:hook].drop(1)
    assert_equal 1, result[:runs]
    refute_includes result[:explicit], "fill", "fill is off by default"
  end
end
