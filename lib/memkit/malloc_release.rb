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
  # When: after a major GC, once its sweep is done: the point where the most
  # has just been freed, and rare enough that the trim (about 0.1 ms per MB
  # given back) and the page faults that hand the memory to the next
  # requests (about 0.17 ms per MB; bench/malloc_release_cost.rb) cost
  # little: 0.97x the requests per second on the app shape. A minor GC
  # frees as much garbage, but runs every few requests: trimming there
  # would trade the same pages back and forth. An app that mallocs as much
  # again between two majors does the same at majors: Pacing spaces the
  # trims out while what they give back comes back.
  #
  # How, with no C and no server hook: an object with a finalizer, allocated
  # and dropped, is freed by the next GC, and Ruby then runs its finalizer;
  # that finalizer arms the next one. Where no malloc_trim exists (musl,
  # jemalloc preloaded: Libc.malloc_trim? false), start does nothing.
  module MallocRelease
    @started = false
    @armed = false # a watched object is waiting for a GC
    @at_exit = false
    @majors = 0
    @releases = 0
    @put_off = 0
    @pacing = nil
    @pacing_pid = nil
    @lock = Mutex.new

    class << self
      # Starts watching, once per process (children forked later inherit
      # it). Returns whether it is on.
      def start
        return false unless Libc.malloc_trim?

        @lock.synchronize do
          unless @started
            @started = true
            @majors = GC.stat(:major_gc_count)
            # Ruby runs every pending finalizer at exit, and repeats while
            # new ones appear: the chain must stop before then.
            at_exit { @started = false } unless @at_exit
            @at_exit = true
            arm unless @armed
          end
        end
        true
      end

      # Stops at the next GC (a start before then goes on with the same chain).
      def stop
        @started = false
      end

      def started? = @started

      # Trims done in this process, and majors whose trim Pacing put off (a
      # forked child starts from its parent's counts).
      attr_reader :releases, :put_off

      # Whether a GC that ran since the last check calls for a trim: a major
      # ran (majors: GC.stat(:major_gc_count) now, last: at the last trim).
      def due?(majors, last) = majors != last

      # Run by the finalizer after a GC.
      def gc_ran
        @armed = false
        return unless @started

        arm
        # Under GC.stress every allocation runs a major: trimming, and reading
        # the RSS (which allocates, so runs more majors), at each would stall
        # the stress run (test/unit/fiber_pool_test.rb ran for minutes).
        return if GC.stress

        majors = GC.stat(:major_gc_count)
        return unless due?(majors, @majors)

        @majors = majors
        unless pacing.trim?
          @put_off += 1
          return
        end

        finish_sweep
        before = rss
        Libc.malloc_trim
        pacing.trimmed(before, rss)
        @releases += 1
      end

      private

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

      def arm
        @armed = true
        ObjectSpace.define_finalizer(Object.new, FINALIZER)
      end

      # A lazily swept GC frees the rest of its garbage as later allocations
      # sweep on: GCRest finishes the sweep first, so the trim
      # sees all of it.
      def finish_sweep
        return unless GC.latest_gc_info(:state) == :sweeping

        GCRest.finish
      end
    end

    # Built once, outside any method holding the object it watches, so the
    # finalizer does not keep that object alive.
    FINALIZER = proc { MallocRelease.gc_ran }
    private_constant :FINALIZER
  end
end
