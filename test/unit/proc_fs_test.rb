# frozen_string_literal: true

require "test_helper"

class ProcFSTest < Minitest::Test
  def test_pid_accepts_integers_and_decimal_strings
    assert_equal 42, Memkit::ProcFS.pid!(42)
    assert_equal 42, Memkit::ProcFS.pid!("42")
  end

  def test_pid_rejects_what_is_not_a_pid
    ["abc", "12abc", "-1", "0", "", nil, 1.5, "0x10", -3].each do |bad|
      error = assert_raises(Memkit::InvalidArgument, bad.inspect) { Memkit::ProcFS.pid!(bad) }
      assert_includes error.message, bad.inspect
    end
  end

  def test_a_process_that_has_exited_is_no_such_process
    pid = fork { exit!(0) }
    Process.wait(pid)
    error = assert_raises(Memkit::NoSuchProcess) { Memkit::ProcFS.read(pid, "status") }
    assert_includes error.message, pid.to_s
  end

  def test_a_host_without_procfs_is_unsupported
    Dir.mktmpdir do |empty|
      error = assert_raises(Memkit::Unsupported) { Memkit::ProcFS.read(Process.pid, "statm", root: empty) }
      assert_match(/Linux/, error.message)
      assert_raises(Memkit::Unsupported) { Memkit::Memory.read(Process.pid, root: empty) }
      assert_raises(Memkit::Unsupported) { Memkit::Tree.read(Process.pid, root: empty) }
    end
  end

  # The kernel hides smaps from processes that may not ptrace the target:
  # a child that drops to another uid reads its parent's smaps_rollup.
  def test_permission_denied_names_the_pid_and_file
    skip "needs root to drop privileges in a child" unless Process.uid.zero?

    parent = Process.pid
    reader, writer = IO.pipe
    child = fork do
      reader.close
      Process::Sys.setgid(65_534)
      Process::Sys.setuid(65_534)
      begin
        Memkit.memory(parent)
        writer.write("no error")
      rescue Memkit::Error => e
        writer.write("#{e.class}: #{e.message}")
      end
      exit!(0)
    end
    writer.close
    result = reader.read
    Process.wait(child)
    assert_match(/\AMemkit::PermissionDenied: .*#{parent}/, result)
    assert_includes result, "/proc/#{parent}/smaps_rollup"
  end

  def test_kb_fields_sums_repeated_keys_into_bytes
    fields = Memkit::ProcFS.kb_fields("Rss: 4 kB\nPss: 2 kB\nRss:   8 kB\nVmFlags: rd wr\n")
    assert_equal({ "Rss" => 12 * 1024, "Pss" => 2 * 1024 }, fields)
  end

  def test_pids_lists_this_process
    assert_includes Memkit::ProcFS.pids, Process.pid
  end

  # One pass over /proc/*/stat gives every parent; a comm with spaces and
  # parentheses (which /proc/PID/stat does not quote) still parses.
  def test_parents_and_children_come_from_one_pass
    reader, writer = IO.pipe
    child = fork do
      reader.close
      File.binwrite("/proc/self/comm", "a) b (c")
      writer.puts
      writer.close
      sleep
    end
    writer.close
    reader.gets
    parents = Memkit::ProcFS.parents
    assert_equal Process.pid, parents.fetch(child)
    assert_equal Process.ppid, parents.fetch(Process.pid)
    assert_includes Memkit::ProcFS.children.fetch(Process.pid), child
    assert_equal "a) b (c\n", File.read("/proc/#{child}/comm")
  ensure
    Process.kill(:KILL, child) if child
    Process.wait(child) if child
  end

  def test_a_kernel_thread_is_told_apart
    refute Memkit::ProcFS.kernel_thread?(Process.pid)
    refute Memkit::ProcFS.kernel_thread?(4_194_304), "no such pid: not a kernel thread"
    skip "pid 2 is not kthreadd here (a pid namespace?)" unless File.exist?("/proc/2/comm") && File.read("/proc/2/comm") == "kthreadd\n"

    assert Memkit::ProcFS.kernel_thread?(2)
  end
end
