# frozen_string_literal: true

require_relative "../memkit"
require_relative "libc"
require_relative "gc_rest"
require_relative "malloc_release/pacing"

module Memkit
  # Gives glibc's free memory back to the kernel after each major GC, in
  # this process and in every child it forks afterwards.
  #
  # Why: most of what a request leaves behind is malloc'd memory (string
  # and array buffers). The GC frees it to glibc, which keeps the pages for
  # reuse: only a free top of the heap above M_TRIM_THRESHOLD goes back by
  # itself. So a worker keeps, for good, the most garbage it ever held
  # between two GCs. On the app shape, after a full GC, a Ruby 3.3 worker's
  # main arena held 42 MB free of 66 MB, and malloc_trim(0) in each worker
  # took the server tree from 354 to 211 MB (docs/BENCHMARKS.md, "CoW on
  # the app shape"; with this running, "malloc release"). Ruby calls
  # malloc_trim only in Process.warmup.
  #
  # When: within a second of a major GC, once its sweep is done: the most
  # has just been freed, and majors are rare enough that the trim (about
  # 0.1 ms per MB given back) and the page faults that hand the memory to
  # the next requests (about 0.17 ms per MB; bench/malloc_release_cost.rb)
  # cost little: 0.97x the requests per second on the app shape. A minor GC
  # frees as much garbage, but runs every few requests: trimming there
  # would trade the same pages back and forth. An app that mallocs as much
  # again between two majors does the same at majors: Pacing spaces the
  # trims out while what they give back comes back.
  #
  # How, with no C and no server hook: a thread in each process looks at
  # GC.stat(:major_gc_count) every INTERVAL seconds and trims when it moved,
  # and Memkit::OobGC looks right after its own GC, so that there the trim
  # runs between requests. Children forked later get their own thread
  # (Process._fork). A finalizer chain would trim sooner, but runs this
  # code (a file read, a call that lets go of the GVL) in Ruby's finalizer
  # context at any point of any thread; Ruby 3.4.11 crashed there (a
  # segfault at a method call's cache, after Process.warmup had compacted)
  # in 1 of 5 runs of the test suite here. Where no malloc_trim exists (musl, jemalloc
  # preloaded: Libc.malloc_trim? false), start does nothing.
  module MallocRelease
    # Seconds between two looks: majors come seconds to minutes apart, and
    # Pacing spaces the trims further where their memory comes back.
    INTERVAL = 1.0
    # Its thread's name, also the kernel's (first 15 bytes) for memkit doctor.
    THREAD = "memkit malloc release"

    @started = false
    @majors = 0
    @releases = 0
    @put_off = 0
    @pacing = nil
    @pacing_pid = nil
    @watcher = nil
    @watcher_pid = nil
    @lock = Mutex.new
    @checking = Mutex.new

    class << self
      # Starts watching, once per process (children forked later inherit
      # it). Returns whether it is on.
      def start
        return false unless Libc.malloc_trim?

        @lock.synchronize do
          unless @started
            @majors = GC.stat(:major_gc_count)
            @started = true
          end
          watch
        end
        true
      end

      # Stops at the next look (a start before then goes on with the same thread).
      def stop
        @started = false
      end

      def started? = @started

      # Trims done in this process, and majors whose trim Pacing put off (a
      # forked child starts from its parent's counts).
      attr_reader :releases, :put_off

      # Trims if a major GC ran since the last look; true if it trimmed. Run
      # by the thread, and by OobGC after its out-of-band GC (which waits
      # out a trim the thread has under way, so that each major is looked
      # at once). Several majors between two looks count as one.
      def check
        return false unless @started
        # Under GC.stress every allocation runs a major: trimming, and reading
        # the RSS (which allocates, so runs more majors), at each would stall
        # the stress run (test/unit/fiber_pool_test.rb ran for minutes).
        return false if GC.stress

        @checking.synchronize { trim_if_due }
      end

      # In a child just forked: the parent's thread did not come along.
      def after_fork
        @lock.synchronize { watch } if @started
      end

      private

      def trim_if_due
        majors = GC.stat(:major_gc_count)
        return false if majors == @majors

        @majors = majors
        unless pacing.trim?
          @put_off += 1
          return false
        end

        finish_sweep
        before = rss
        Libc.malloc_trim
        pacing.trimmed(before, rss)
        @releases += 1
        true
      end

      # One thread per process; it ends at the first look after stop.
      def watch
        return if @watcher_pid == Process.pid && @watcher&.alive?

        @watcher_pid = Process.pid
        @watcher = Thread.new do
          loop do
            sleep INTERVAL
            break unless watching?

            check
          end
        end
        @watcher.name = THREAD
      end

      # Under the lock, so that a start racing the thread's end makes a new one.
      def watching?
        @lock.synchronize do
          @watcher = nil unless @started
          @started
        end
      end

      # This process's own: a child's RSS says nothing of its parent's trims.
      def pacing
        unless @pacing_pid == Process.pid
          @pacing = Pacing.new
          @pacing_pid = Process.pid
        end
        @pacing
      end

      # nil where /proc is missing.
      def rss
        Memkit.rss
      rescue Memkit::Error
        nil
      end

      # A lazily swept GC frees the rest of its garbage as later allocations
      # sweep on: GCRest finishes the sweep first, so the trim
      # sees all of it.
      def finish_sweep
        return unless GC.latest_gc_info(:state) == :sweeping

        GCRest.finish
      end
    end

    # Prepended to Process's singleton class: Process._fork (Ruby 3.1+) is
    # what every fork path calls, except Process.daemon where libc's
    # daemon(3) serves it (Ruby 3.1-3.3 on Linux). At load, not at start:
    # memkit/fork starts the release inside its own _fork hook, and a hook
    # prepended then would miss that first fork's child.
    module ForkHook
      def _fork
        pid = super
        MallocRelease.after_fork if pid.zero?
        pid
      end

      def daemon(*args, **kwargs)
        super.tap { MallocRelease.after_fork }
      end
    end
    private_constant :ForkHook
    Process.singleton_class.prepend(ForkHook)
  end
end
