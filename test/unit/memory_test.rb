# frozen_string_literal: true

require "test_helper"
require "fileutils"

class MemoryTest < Minitest::Test
  MB = 1024 * 1024

  def test_rss_reads_statm
    statm = Memkit::Statm.read(Process.pid)
    rss = Memkit.rss
    assert_kind_of Integer, rss
    assert_in_delta statm.resident, rss, 2 * MB
    assert_equal 0, rss % Memkit::ProcFS::PAGE_SIZE
  end

  def test_rss_of_other_processes_and_bad_pids
    with_children(1) do |(pid)|
      assert_operator Memkit.rss(pid), :>, 0
      assert_operator Memkit.rss(pid.to_s), :>, 0
    end
    assert_raises(Memkit::InvalidArgument) { Memkit.rss("abc") }
    gone = fork { exit!(0) }
    Process.wait(gone)
    assert_raises(Memkit::NoSuchProcess) { Memkit.rss(gone) }
  end

  def test_memory_fields_are_consistent_integers
    memory = Memkit.memory
    Memkit::Memory.members.each { |f| assert_kind_of Integer, memory[f], f }
    assert_equal memory.private_clean + memory.private_dirty, memory.uss
    assert_equal memory.shared_clean + memory.shared_dirty, memory.shared
    assert_equal memory.rss, memory.uss + memory.shared
    assert_operator memory.pss, :<=, memory.rss
    assert_operator memory.pss, :>=, memory.uss
  end

  # Copy-on-write as the kernel does it: a child shares a 64 MB buffer with
  # its parent until it writes to it.
  def test_a_child_shares_until_it_writes
    buffer = "x" * (64 * MB)
    reader, writer = IO.pipe
    child = fork do
      reader.close
      before = Memkit.memory
      (0...buffer.bytesize).step(4096) { |i| buffer.setbyte(i, 121) }
      after = Memkit.memory
      writer.write(Marshal.dump([before.to_h, after.to_h]))
      exit!(0)
    end
    writer.close
    before, after = Marshal.load(reader.read) # from our own child, not from outside
    Process.wait(child)
    assert_operator before[:shared], :>=, 60 * MB
    assert_operator after[:private_dirty] - before[:private_dirty], :>=, 60 * MB
    assert_operator before[:shared] - after[:shared], :>=, 60 * MB
  ensure
    buffer = nil
  end

  # A process of its own (not a fork of this busy test process, whose
  # writes would move pages from shared to private between the two reads),
  # read once it has said it is idle.
  def test_smaps_gives_the_same_totals_as_smaps_rollup
    io = IO.popen([RbConfig.ruby, "-e", "puts :ready; $stdout.flush; sleep"])
    assert_equal "ready\n", io.gets
    rollup = Memkit.memory(io.pid)
    summed = Memkit.memory(io.pid, source: :smaps)
    Memkit::Memory.members.each { |f| assert_in_delta rollup[f], summed[f], 64 * 1024, f }
  ensure
    Process.kill(:KILL, io.pid)
    io.close
  end

  # A kernel older than 4.14 has smaps but no smaps_rollup. A /proc-shaped
  # folder that links to the real smaps (and nothing else) takes that path.
  def test_falls_back_to_smaps_when_the_kernel_has_no_rollup
    with_children(1) do |(pid)|
      Dir.mktmpdir do |root|
        { "self" => "self", pid.to_s => pid }.each do |dir, real|
          FileUtils.mkdir(File.join(root, dir))
          %w[stat smaps].each { |f| FileUtils.ln_s("/proc/#{real}/#{f}", File.join(root, dir, f)) }
        end
        # Read between two direct reads: a child still settling moves its rss
        # in between, so the fallback must lie within what the two saw.
        before = Memkit.memory(pid, source: :smaps).rss
        fallback = Memkit::Memory.read(pid, root: root)
        after = Memkit.memory(pid, source: :smaps).rss
        low, high = [before, after].minmax
        assert_operator fallback.rss, :>=, low - 64 * 1024
        assert_operator fallback.rss, :<=, high + 64 * 1024
        error = assert_raises(Memkit::Unsupported) { Memkit::Memory.read(pid, source: :smaps_rollup, root: root) }
        assert_includes error.message, "smaps_rollup"
      end
    end
  end

  # A zombie is a process that has exited but not been reaped: its memory
  # files read empty. That is a process gone, not a parse error.
  def test_a_zombie_is_no_such_process
    zombie = fork { exit!(0) }
    wait_until(message: "zombie state") { File.read("/proc/#{zombie}/stat")[/\) (\w)/, 1] == "Z" }
    assert_raises(Memkit::NoSuchProcess) { Memkit.memory(zombie) }
  ensure
    Process.wait(zombie) if zombie
  end

  def test_parse_raises_naming_the_missing_field
    text = File.read(File.join(ROOT, "test/fixtures/proc/smaps_rollup")).sub(/^Pss:.*\n/, "")
    error = assert_raises(Memkit::ParseError) { Memkit::Memory.parse(text, "/proc/7/smaps_rollup") }
    assert_equal "/proc/7/smaps_rollup: no Pss field", error.message
  end

  # kthreadd is alive but has no user address space: its smaps files answer
  # ESRCH. It reads as all zero, not as a missing process.
  def test_a_kernel_thread_has_no_user_memory
    skip "pid 2 is not kthreadd here (a pid namespace?)" unless File.exist?("/proc/2/comm") && File.read("/proc/2/comm") == "kthreadd\n"

    memory = Memkit::Memory.read(2)
    assert_same Memkit::Memory::NONE, memory
    assert_equal 0, memory.rss + memory.pss + memory.uss + memory.swap
    pid = fork { exit!(0) }
    Process.wait(pid)
    assert_raises(Memkit::NoSuchProcess) { Memkit::Memory.read(pid) }
  end
end
