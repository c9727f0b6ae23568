# frozen_string_literal: true

require "test_helper"
require "json"
require "memkit/cow"

class CowTest < Minitest::Test
  BIG = 32 << 20

  def setup
    skip "needs Linux /proc" unless linux?
  end

  # A parent holding 32 MiB of its own, with one child that leaves it alone
  # and one that rewrites all of it.
  def with_tree
    $cow_test_buffer = "x".b * BIG
    writer = ->(i) { (0...BIG).step(4096) { |o| $cow_test_buffer.setbyte(o, 2) } if i == 1 }
    with_children(2, child: writer) do |pids|
      yield pids
    end
  ensure
    $cow_test_buffer = nil
  end

  def test_exact_sharing_tells_a_reader_from_a_writer
    skip "page frame numbers need root" unless Process.uid.zero?

    with_tree do |(reader, writer)|
      # Run from another process: reading pagemap allocates, and a parent
      # that writes after fork makes its own pages private too.
      out, err, status = memkit("cow", Process.pid, "--json")
      assert status.success?, err
      report = JSON.parse(out, symbolize_names: true)
      assert_equal "pagemap", report[:method]
      assert_equal report[:master][:pss] + report[:workers].sum { |w| w[:pss] }, report[:tree_pss]
      assert_operator report[:workers].find { |w| w[:pid] == writer }[:uss], :>, BIG * 3 / 4
      workers = report[:workers].to_h { |w| [w[:pid], w] }
      # The memkit process itself is this test's child too.
      assert_equal [reader, writer].sort, (workers.keys & [reader, writer]).sort
      assert_operator workers[reader][:shared_with_master] - workers[writer][:shared_with_master], :>, BIG * 3 / 4
      assert_operator workers[writer][:private_dirty], :>, BIG * 3 / 4
      assert_operator workers[reader][:private_dirty], :<, BIG / 4
      # In points of the master's rss, which is this whole test process: 32 MiB
      # of it is 10 points at 320 MiB, so a fixed number of points would
      # depend on which tests ran first.
      points = 100.0 * (BIG * 3 / 4) / report[:master][:rss]
      assert_operator workers[reader][:shared_pct] - workers[writer][:shared_pct], :>, points
    end
  end

  def test_estimate_agrees_in_direction_and_exact_is_refused_without_frames
    with_tree do |(reader, writer)|
      cow = Memkit::Cow.read(Process.pid, exact: false)
      assert_equal :estimate, cow.method
      by_pid = cow.workers.to_h { |w| [w.pid, w] }
      # In bytes: both percentages can reach their 100% cap when the master
      # (this test process) is smaller than what the children share.
      assert_operator by_pid[reader].shared_with_master, :>, by_pid[writer].shared_with_master
      assert_equal [reader, writer], Memkit::Cow.children(Process.pid).sort & [reader, writer]
    end
  end

  def test_unprivileged_reader_falls_back_to_the_estimate
    skip "needs root to drop privileges" unless Process.uid.zero?
    skip "needs setpriv" unless system("command -v setpriv >/dev/null 2>&1")

    script = <<~RUBY
      require "json"
      $b = "x".b * (8 << 20)
      pid = fork { sleep }
      sleep 0.3
      out = `#{RbConfig.ruby} -I#{File.join(ROOT, 'lib')} #{EXE} cow \#{Process.pid} --json`
      Process.kill(:KILL, pid)
      Process.wait(pid)
      print JSON.generate(JSON.parse(out).merge("child" => pid))
    RUBY
    out, err, status = Open3.capture3("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                      RbConfig.ruby, "-e", script, chdir: "/")
    skip "nobody cannot run ruby here: #{err[0, 200]}" unless status.success? && !out.empty?
    report = JSON.parse(out, symbolize_names: true)
    assert_equal "estimate", report[:method]
    assert_includes report[:workers].map { |w| w[:pid] }, report[:child]
  end

  def test_cli_table_and_errors
    with_children(1) do |(child)|
      out, err, status = memkit("cow", Process.pid)
      assert status.success?, err
      assert_match(/^tree #{Process.pid}: pss [\d.]+ \w+ \(master [\d.]+ \w+ \+ \d+ workers/, out)
      assert_match(/worker uss mean /, out)
      assert_match(/^master #{Process.pid}: rss /, out)
      assert_match(/^\s*#{child}\s/, out)
      assert_match(/shared%/, out)
    end
    _, err, status = memkit("cow")
    assert_equal 2, status.exitstatus
    assert_match(/missing PID/, err)
    _, err, status = memkit("cow", "nope")
    assert_equal 2, status.exitstatus
    assert_match(/not a pid/, err)
    _, err, status = memkit("cow", 2**22 + 12_345)
    assert_equal 1, status.exitstatus
    assert_match(/no such process/, err)
  end

  def test_a_process_without_children
    pid = spawn(RbConfig.ruby, "-e", "sleep")
    out, err, status = memkit("cow", pid)
    assert status.success?, err
    assert_match(/no workers/, out)
  ensure
    Process.kill(:KILL, pid) rescue nil
    Process.wait(pid) rescue nil
  end

  def test_bench_cow_help_exits_zero_without_running
    out, err, status = memkit("bench", "cow", "--help")
    assert status.success?, err
    assert_match(/Usage: memkit bench cow/, out)
    refute_match(/tree_pss/, out, "--help must not run the benchmark")
  end

  # Outside the source tree, as from an installed gem: nothing under bench/ is needed.
  def test_bench_cow_one_child_both_shapes_outside_the_repo
    out, err, status = memkit("bench", "cow", "--children", "1", "--shape", "tree,app", "--depth", "12",
                              "--scale", "0.02", "--requests", "20", "--modes", "plain,warmup", "--no-python",
                              chdir: Dir.tmpdir)
    assert status.success?, err
    assert_match(/tree_pss/, out)
    assert_match(/^app\s+warmup\s+tree [\d.]+ \w+\s+[\d.]+x plain/, out)
  end

  def test_invalid_exact_option
    assert_raises(Memkit::InvalidArgument) { Memkit::Cow.read(Process.pid, exact: :yes) }
  end
end
