# frozen_string_literal: true

require "test_helper"
require "support/server_tree"

class TreeTest < Minitest::Test
  def test_a_forked_tree_with_its_true_totals
    ServerTree.run(workers: 3) do |master|
      tree = Memkit.tree(master)
      assert_equal master, tree.root.pid
      assert_equal 4, tree.nodes.size
      assert_equal [0, 1, 1, 1], tree.nodes.map(&:depth)
      assert(tree.nodes.drop(1).all? { |n| n.ppid == master })
      assert_equal tree.nodes.sum { |n| n.memory.pss }, tree.total_pss
      assert_equal tree.nodes.sum { |n| n.memory.uss }, tree.total_uss
      # Summing RSS counts the shared heap once per worker: far above PSS.
      assert_operator tree.total_rss, :>, 2 * tree.total_pss
      tree.nodes.drop(1).each do |worker|
        assert_operator worker.shared_pct, :>, 50, "worker #{worker.pid} shares most of the master"
        assert_operator worker.shared_pct, :<=, 100
      end
      assert_match(/\A.*ruby/, tree.root.command)
    end
  end

  # Issue #2: on a real forked tree, total PSS and each USS agree with smem within 2%.
  def test_agrees_with_smem
    skip "smem is not installed (script/setup installs it)" unless system("command -v smem >/dev/null")

    ServerTree.run(workers: 3) do |master|
      # Compare a snapshot that held still while smem read it: the same USS
      # before and after (a process settling into sleep moves pages; PSS of
      # libc moves whenever any process on the machine starts or exits).
      uss_of = ->(t) { t.nodes.map { |n| n.memory.uss } }
      tree = smem = nil
      3.times do
        before = Memkit.tree(master)
        table = `smem -c "pid uss pss" -H`.lines.to_h do |line|
          pid, uss, pss = line.split.map(&:to_i)
          [pid, { uss: uss * 1024, pss: pss * 1024 }]
        end
        if uss_of.(Memkit.tree(master)) == uss_of.(before)
          tree, smem = before, table
          break
        end
        sleep 0.5
      end
      refute_nil smem, "the tree held still for one smem run"
      pids = tree.nodes.map(&:pid)
      assert_equal pids.sort, (smem.keys & pids).sort, "smem sees every process of the tree"
      smem_pss = pids.sum { |pid| smem.fetch(pid)[:pss] }
      assert_in_delta smem_pss, tree.total_pss, 0.02 * smem_pss
      tree.nodes.each do |node|
        expected = smem.fetch(node.pid)[:uss]
        assert_in_delta expected, node.memory.uss, 0.02 * expected, "uss of pid #{node.pid}"
      end
    end
  end

  def test_sort_orders_workers_and_keeps_the_root_first
    ServerTree.run(workers: 3, slices: 3) do |master|
      tree = Memkit.tree(master).sort_by(:uss)
      assert_equal master, tree.root.pid
      ussed = tree.nodes.drop(1).map { |n| n.memory.uss }
      assert_equal ussed.sort.reverse, ussed
    end
  end

  def test_json_shape
    ServerTree.run(workers: 2, heap_strings: 1000) do |master|
      hash = Memkit.tree(master).to_h
      assert_equal master, hash[:root]
      assert_equal %i[rss pss uss swap], hash[:total].keys
      hash[:processes].each do |process|
        %i[pid ppid command rss pss uss shared_clean shared_dirty private_dirty swap].each do |key|
          assert process.key?(key), "process has #{key}"
        end
      end
    end
  end

  # A zombie is a child caught mid-exit: it is left out, never a crash.
  def test_a_child_that_exits_while_the_tree_is_read_is_skipped
    zombie = fork { exit!(0) }
    wait_until(message: "zombie") { File.read("/proc/#{zombie}/stat")[/\) (\w)/, 1] == "Z" }
    tree = Memkit.tree(Process.pid)
    refute_includes tree.nodes.map(&:pid), zombie
    assert_equal Process.pid, tree.root.pid
  ensure
    Process.wait(zombie) if zombie
  end

  # The racy version: children come and go every millisecond while we read.
  # The test kills it; the deadline only stops an orphan. With 30 s, the
  # ruby34 lane (three lanes side by side) once read the tree after the
  # churner had exited, and the missing root failed the test.
  CHURN = <<~'RUBY'
    $stdout.sync = true
    puts "ready"
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 600
    while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
      fork { sleep(rand * 0.004) }
      sleep 0.001
      begin
        nil while Process.wait(-1, Process::WNOHANG)
      rescue Errno::ECHILD
        nil
      end
    end
  RUBY

  def test_reading_a_tree_whose_children_churn_never_fails
    io = IO.popen([RbConfig.ruby, "-e", CHURN])
    assert_equal "ready\n", io.gets
    # Each read lists the children, then reads each one's /proc files while
    # some of them exit: 20 reads, and more until some children were seen.
    seen = reads = 0
    while reads < 20 || (seen.zero? && reads < 200)
      tree = Memkit.tree(io.pid)
      assert_equal io.pid, tree.root.pid
      seen += tree.nodes.size - 1
      reads += 1
    end
    assert_operator seen, :>, 0, "the tree saw some of the short-lived children"
  ensure
    begin
      Process.kill(:KILL, io.pid) if io
    rescue Errno::ESRCH
      nil # already gone
    end
    io&.close
  end

  def test_missing_root
    gone = fork { exit!(0) }
    Process.wait(gone)
    error = assert_raises(Memkit::NoSuchProcess) { Memkit.tree(gone) }
    assert_includes error.message, gone.to_s
    assert_raises(Memkit::InvalidArgument) { Memkit.tree("abc") }
  end

  # shared% is the part of a process's own rss that it shares. A child that
  # shares 64 MiB with its own child shares more than its parent's whole rss:
  # as a share of the root's rss that read as a capped 100%.
  def test_shared_percentage_is_of_the_process_own_rss
    script = <<~RUBY
      child = fork do
        big = "x" * (64 << 20)
        fork { big.size; sleep }
        big.size
        sleep
      end
      puts child
      STDOUT.flush
      sleep
    RUBY
    IO.popen([RbConfig.ruby, "-e", script], "r", pgroup: true) do |io|
      child = io.gets.to_i
      wait_until(message: "grandchild forked") { Memkit::ProcFS.children.fetch(child, []).any? }
      tree = Memkit.tree(io.pid)
      node = tree.nodes.find { |n| n.pid == child }
      assert_operator node.memory.shared, :>, tree.root.memory.rss, "precondition: shares more than the root's rss"
      tree.nodes.each do |n|
        assert_in_delta 100.0 * n.memory.shared / n.memory.rss, n.shared_pct, 1e-9
        assert_operator n.shared_pct, :<=, 100
      end
      assert_equal node.shared_pct.round(1), node.to_h[:shared_pct]
    ensure
      Process.kill(:KILL, -io.pid)
    end
  end
end
