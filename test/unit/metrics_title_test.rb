# frozen_string_literal: true

require "test_helper"
require "memkit/metrics"

class MetricsTitleTest < Minitest::Test
  Title = Memkit::Metrics::Title

  def test_the_servers_titles
    assert_equal [:worker, 2], Title.parse("unicorn worker[2] -c unicorn.conf.rb config.ru")
    assert_equal [:worker, 11], Title.parse("puma: cluster worker 11: 4242 [app]")
    assert_equal [:worker, 0], Title.parse("pitchfork (gen:3) worker[0] - ready")
    assert_equal [:mold, nil], Title.parse("pitchfork (gen:1) mold - init")
    assert_equal [nil, nil], Title.parse("unicorn master -c unicorn.conf.rb config.ru")
    assert_equal [nil, nil], Title.parse("puma 8.0.2 (tcp://127.0.0.1:9292) [app]")
    assert_equal [nil, nil], Title.parse("ruby foreman.rb")
    assert_equal [nil, nil], Title.parse("vim worker[x]")
    assert_equal [:worker, 1], Title.parse("unicorn worker[1]\n\e[31m\xFF".b)
  end

  # master: from a worker, up through workers and molds, stopping below the
  # wrapper; from the master (or any untitled process), itself.
  def test_master_is_the_first_ancestor_the_server_does_not_call_a_worker
    Dir.mktmpdir do |root|
      FileUtils.touch(File.join(root, "self"))
      fake = lambda do |pid, ppid, title|
        dir = File.join(root, pid.to_s)
        Dir.mkdir(dir)
        File.write(File.join(dir, "cmdline"), title.tr(" ", "\0"))
        File.write(File.join(dir, "status"), "Name:\truby\nPid:\t#{pid}\nPPid:\t#{ppid}\nThreads:\t1\n")
      end
      fake.(100, 1, "ruby foreman.rb")                     # a wrapper that spawns the server
      fake.(200, 100, "puma 8.0.2 (tcp://127.0.0.1:9292) [app]")
      fake.(300, 200, "puma: cluster worker 0: 200 [app]")
      fake.(400, 300, "puma: cluster worker 1: 200 [app]") # fork_worker: forked by worker 0
      fake.(500, 1, "unicorn worker[0] -c u.rb")           # orphaned: its master is gone
      fake.(600, 1, "pitchfork monitor - config.ru")
      fake.(610, 600, "pitchfork (gen:1) mold - ready")
      fake.(620, 610, "<pitchfork fork_sibling(spawn_worker)>") # the middle of a double fork
      fake.(630, 620, "pitchfork (gen:1) worker[1] - init")
      assert_equal 200, Title.master(400, root: root)
      assert_equal 200, Title.master(300, root: root)
      assert_equal 200, Title.master(200, root: root)
      assert_equal 100, Title.master(100, root: root)
      assert_equal 500, Title.master(500, root: root)
      assert_equal 600, Title.master(630, root: root)
      assert_equal 600, Title.master(620, root: root)
    end
  end
end
