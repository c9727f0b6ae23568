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
  # pages back and forth, so only a major starts a trim.
  def test_minor_gcs_do_not_trim
    skip "no malloc_trim in this process" unless Memkit::Libc.malloc_trim?

    in_fresh_process { minor_gcs_do_not_trim }
  end

  # Its thread sleeps between looks and does not hold the process up.
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

    looks = in_child do
      Memkit::MallocRelease.start
      GC.start
      before = handled
      GC.stress = true
      under_stress = Array.new(3) { Memkit::MallocRelease.check }
      during = handled - before
      GC.stress = false
      Memkit::MallocRelease.check
      [under_stress, during, handled - before]
    end
    # The majors the stress ran count once, at the first look after it.
    assert_equal [[false, false, false], 0, 1], looks
  end

  # A child forked after start, by fork or by Process.daemon, gets its own
  # thread; stop ends it at its next look.
  def test_each_process_has_its_thread_until_stopped
    skip "no malloc_trim in this process" unless Memkit::Libc.malloc_trim?

    threads = in_child do
      Memkit::MallocRelease.start
      forked = in_child { watchers }
      r, w = IO.pipe
      pid = fork do
        r.close
        Process.daemon(true, true)
        w.write(watchers)
        exit!(0)
      end
      w.close
      Process.wait(pid)
      daemon = Timeout.timeout(30) { r.read }.to_i
      Memkit::MallocRelease.stop
      wait_for { watchers.zero? }
      { forked: forked, daemon: daemon, stopped: watchers }
    end
    assert_equal({ forked: 1, daemon: 1, stopped: 0 }, threads)
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
    # The thread's look trims after the major, before the minors.
    wait_for { Memkit::MallocRelease.releases >= 1 }
    majors = GC.stat(:major_gc_count)
    before = Memkit::MallocRelease.releases
    5.times do
      Array.new(20_000) { "y" * 100 }
      GC.start(full_mark: false)
      Memkit::MallocRelease.check
    end
    # A major Ruby ran among them is trimmed at the look after it.
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
      Memkit::MallocRelease.check
    end
    churned = { releases: Memkit::MallocRelease.releases - releases, put_off: Memkit::MallocRelease.put_off - put_off,
                majors: GC.stat(:major_gc_count) - majors }
    # Two majors between two looks count once.
    assert_operator churned[:put_off], :>=, 4, churned.inspect
    assert_operator churned[:releases], :<=, churned[:majors] - churned[:put_off], churned.inspect
    # Nothing malloc'd again: the next trim runs, and the one after.
    quiet = Memkit::MallocRelease.releases
    30.times do
      GC.start
      Memkit::MallocRelease.check
    end
    assert_operator Memkit::MallocRelease.releases - quiet, :>=, 10, "trims after the churn ended"
  end

  # Majors trimmed or put off (Pacing).
  def handled = Memkit::MallocRelease.releases + Memkit::MallocRelease.put_off

  def watchers = Thread.list.count { |t| t.name == Memkit::MallocRelease::THREAD }

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
        before = Memkit::MallocRelease.releases
        GC.start
        wait_for { Memkit::MallocRelease.releases > before } if start # the thread's next look
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
