# frozen_string_literal: true

require_relative "../libc"

module Memkit
  class OobGC
    # The free memory glibc keeps at the top of each malloc arena (M_TOP_PAD),
    # sized for what a GC run between requests frees.
    #
    # glibc hands the free top of an arena back to the kernel as soon as a
    # free() leaves more than its trim threshold there. A GC between
    # requests frees, at once, everything malloc'd since the last GC, when
    # nothing of it is live any more: on Puma, whose request thread has an
    # arena of its own, glibc gave back 16 MB after each GC of the "huge"
    # shape and the next request faulted it back in: about 1,470 page faults
    # a request where Ruby alone, collecting lazily inside requests, had at
    # most 120, and 0.72x its throughput; 44 faults and 0.94x with this pad
    # (docs/BENCHMARKS.md, "OobGC and glibc's trim"). Covering twice the
    # malloc'd bytes a GC frees, what glibc keeps is the memory the next
    # requests use again (once those bytes left 770 faults a request).
    #
    # Setting any of glibc's malloc parameters also freezes its mmap
    # threshold, which glibc otherwise raises as large blocks are freed: set
    # at a worker's first request, it stayed low and 1-4 MB blocks were
    # mmap'd afresh each time. So the collector sets the pad only
    # once the worker has warmed up. The pad only grows, up to max_bytes, and
    # is process-wide, as glibc's parameter is. Where there is no mallopt
    # (musl, macOS) or glibc refuses the value, nothing is set again.
    class MallocPad
      UNIT = 1 << 20
      INT_MAX = (1 << 31) - 1

      @shared = nil

      class << self
        # The process's pad (the first caller's bound holds): forked workers
        # inherit both it and glibc's parameter.
        def shared(max_bytes:) = @shared ||= new(max_bytes: max_bytes)
      end

      attr_reader :bytes

      # libc: anything with #mallopt? and #mallopt_top_pad(bytes) returning
      # true, false or nil. mallopt is bound at the first #cover, not here:
      # loading Fiddle where the middleware is built changed the heap a
      # fresh process starts with enough that test/integration/oob_gc_test.rb's
      # out_of_band hook test saw every GC run before the hook.
      def initialize(max_bytes:, libc: Libc)
        @max = [max_bytes, INT_MAX].min
        @libc = libc
        @bytes = 0
      end

      # `freed`: the malloc'd bytes the GC about to run frees at most (Ruby's
      # malloc_increase_bytes). Returns the pad in bytes (0 while none is set).
      def cover(freed)
        want = [((2 * freed) + UNIT - 1) / UNIT * UNIT, @max].min
        return @bytes if want <= @bytes

        if @libc.mallopt? && @libc.mallopt_top_pad(want)
          @bytes = want
        else
          @max = 0
        end
        @bytes
      end
    end
  end
end
