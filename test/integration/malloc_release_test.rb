# frozen_string_literal: true

require "test_helper"

# Memkit::MallocRelease with real forked processes, the real GC and glibc.
class MallocReleaseTest < Minitest::Test
  # A parent starts it and forks; the child, like a worker, leaves ~60 MB of
  # malloc'd garbage behind, then a major GC runs. With the release its RSS
  # falls back; without, glibc keeps the pages. In a fresh process: a heap
  # grown by earlier tests frees object pages in that GC too (ruby34 lane:
  # 29 MB counted once against 42 MB alone).
  def test_a_child_forked_after_start_gives_its_freed_memory_back_after_a_major_gc
    skip "no malloc_trim in this process" unless Memkit::Libc.malloc_trim?

    in_fresh_process { forked_child_gives_back }
  end

  # Minor GCs run every few requests: trimming there would hand the same
  # pages back and forth, so only a major starts a trim. In a fresh process:
  # in a child of the test process, a finalizer the parent left pending
  # (armed before its last major) ran late and counted a trim among the
  # minors (ruby33 lane: 2 trims for 1 major).
  def test_minor_gcs_do_not_trim
    skip "no malloc_trim in this process" unless Memkit::Libc.malloc_trim?

    in_fresh_process { minor_gcs_do_not_trim }
  end

  # Ruby runs every pending finalizer at exit, again and again while new
  # ones appear: the chain stops there, and the process exits.
  def test_a_process_that_started_it_exits
    skip "no malloc_trim in this process" unless Memkit::Libc.malloc_trim?

    code = 'require "memkit"; Memkit::MallocRelease.start; 3.times { GC.start }; puts Memkit::MallocRelease.releases'
    Open3.popen2e(RbConfig.ruby, "-I#{ROOT}/lib", "-e", code) do |stdin, out, wait|
      stdin.close
      unless wait.join(30)
        Process.kill(:KILL, wait.pid)
        flunk "the process did not exit in 30 s"
      end
      output = out.read
      assert_predicate wait.value, :success?, output
      assert_match(/\A\d+\n\z/, output)
    end
  end

  # An app that mallocs as much again between two majors only takes back,
  # through page faults, what each trim gave: the trims space out (Pacing),
  # and one whose memory stays given back trims again at the next major.
  def test_trims_space_out_while_their_memory_comes_back
    skip "no malloc_trim in this process" unless Memkit::Libc.malloc_trim?

    in_fresh_process { trims_space_out }
  end

  # Under GC.stress every allocation runs a major; a trim and an RSS
  # reading at each made a stress test run for minutes.
  def test_gc_stress_runs_no_trims
    skip "no malloc_trim in this process" unless Memkit::Libc.malloc_trim?

    in_fresh_process do
      Memkit::MallocRelease.start
      pid = fork do
        GC.start
        wait_for { Memkit::MallocRelease.releases >= 1 }
        before = Memkit::MallocRelease.releases
        GC.stress = true
        Array.new(20) { |i| "s#{i}" }
        GC.stress = false
        # The first GC after the stress may trim once for the majors it ran.
        exit!(Memkit::MallocRelease.releases - before <= 1 ? 0 : 1)
      end
      status = nil
      begin
        wait_until(timeout: 30, interval: 0.1, message: "20 allocations under GC.stress") do
          status = Process.wait2(pid, Process::WNOHANG)&.last
        end
      ensure
        Process.kill(:KILL, pid) && Process.wait(pid) unless status
      end
      assert_predicate status, :success?, "more than one trim under GC.stress"
    end
  end

  def test_start_says_false_where_glibc_has_no_malloc_trim
    Memkit::Libc.stub(:malloc_trim?, false) do
      refute Memkit::MallocRelease.start
    end
  end

  def test_warmup_starts_it_unless_told_not_to
    assert_raises(Memkit::InvalidArgument) { Memkit.warmup(malloc_release: :yes) }
    skip "no malloc_trim in this process" unless Memkit::Libc.malloc_trim?

    started = in_child do
      Memkit::MallocRelease.stop
      Memkit.warmup(malloc_release: false, force: true)
      off = Memkit::MallocRelease.started?
      report = Memkit.warmup(force: true)
      [off, Memkit::MallocRelease.started?, report.steps.include?(:malloc_release)]
    end
    assert_equal [false, true, true], started
  end

  private

  def minor_gcs_do_not_trim
    Memkit::MallocRelease.start
    GC.start
    # The major's release runs at Ruby's next interrupt check: counted
    # before the minors, not among them.
    wait_for { Memkit::MallocRelease.releases >= 1 }
    majors = GC.stat(:major_gc_count)
    before = Memkit::MallocRelease.releases
    5.times do
      Array.new(20_000) { "y" * 100 }
      GC.start(full_mark: false)
      sleep 0.01
    end
    # A major Ruby ran among them is trimmed after it, at the next check.
    wait_for { Memkit::MallocRelease.releases - before >= GC.stat(:major_gc_count) - majors }
    result = { releases: Memkit::MallocRelease.releases - before, majors: GC.stat(:major_gc_count) - majors }
    assert_equal result[:majors], result[:releases], result.inspect
  end

  def trims_space_out
    Memkit::MallocRelease.start
    GC.start
    wait_for { Memkit::MallocRelease.releases >= 1 }
    releases = Memkit::MallocRelease.releases
    put_off = Memkit::MallocRelease.put_off
    majors = GC.stat(:major_gc_count)
    10.times do
      # With GC on, Ruby may start majors of its own mid-churn, while the
      # garbage is live: their trims give back little, and a small trim ends
      # the wait (Pacing), so what is put off would hang on where they fall.
      GC.disable
      garbage = Array.new(40_000) { |i| "x" * (600 + (i % 800)) }
      garbage = nil # rubocop:disable Lint/UselessAssignment -- dropped for the GC
      GC.enable
      GC.start
      sleep 0.01
    end
    churned = { releases: Memkit::MallocRelease.releases - releases, put_off: Memkit::MallocRelease.put_off - put_off,
                majors: GC.stat(:major_gc_count) - majors }
    # Two majors before Ruby runs the finalizer count once.
    assert_operator churned[:put_off], :>=, 4, churned.inspect
    assert_operator churned[:releases], :<=, churned[:majors] - churned[:put_off], churned.inspect
    # Nothing malloc'd again: the next trim runs, and the one after.
    quiet = Memkit::MallocRelease.releases
    30.times do
      GC.start
      sleep 0.01
    end
    assert_operator Memkit::MallocRelease.releases - quiet, :>=, 10, "trims after the churn ended"
  end

  def wait_for(seconds = 5)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
    sleep 0.01 until yield || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
  end

  def forked_child_gives_back
    with = child_after_garbage(start: true)
    without = child_after_garbage(start: false)
    assert_operator with[:releases], :>=, 1, with.inspect
    assert_operator with[:dropped], :>=, 30 << 20, "RSS given back with the release: #{with.inspect}"
    assert_operator without[:dropped], :<, 10 << 20, "glibc keeps the pages without it: #{without.inspect}"
  end

  def child_after_garbage(start:)
    in_child do
      # This process may have started it already (Memkit.warmup in other tests).
      start ? Memkit::MallocRelease.start : Memkit::MallocRelease.stop
      in_child do
        GC.start
        sleep 0.01
        bufs = Array.new(60_000) { |i| "x" * (600 + (i % 800)) }
        kept = Array.new(3_000) { |i| bufs[i * 20] }
        bufs = nil
        high = Memkit.rss
        pages = GC.stat(:heap_allocated_pages)
        GC.start
        sleep 0.01 # Ruby runs finalizers at its next interrupt check
        # The GC also frees empty object pages, as many as the heap this
        # process inherited had spare: not what glibc keeps or gives back.
        freed_pages = (pages - GC.stat(:heap_allocated_pages)) * GC::INTERNAL_CONSTANTS.fetch(:HEAP_PAGE_SIZE)
        { releases: Memkit::MallocRelease.releases, dropped: high - Memkit.rss - [freed_pages, 0].max,
          kept: kept.size }
      end
    end
  end

  # Runs the block in a forked child and returns its Marshal'd result.
  def in_child
    r, w = IO.pipe
    pid = fork do
      r.close
      w.write(Marshal.dump(yield))
      w.close
      exit!(0)
    end
    w.close
    data = Timeout.timeout(60) { r.read }
    Process.wait(pid)
    Marshal.load(data) # rubocop:disable Security/MarshalLoad -- our own child's result
  ensure
    r&.close
  end
end
