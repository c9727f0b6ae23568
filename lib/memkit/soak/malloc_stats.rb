# frozen_string_literal: true

require_relative "../libc"

module Memkit
  module Soak
    # Bytes the C allocator has handed out and not got back, for this process.
    #
    # Tried in order: jemalloc's mallctl("stats.allocated") when jemalloc is
    # loaded (LD_PRELOAD or linked), glibc's mallinfo2() (glibc 2.33+), and
    # last GC.stat(:malloc_increase_bytes), which only counts Ruby's own
    # xmalloc since the last GC and is a proxy, not a total. #source says
    # which one is in use, and reports carry it.
    class MallocStats
      attr_reader :source

      def initialize
        if Libc.jemalloc?
          @source = "jemalloc stats.allocated"
          @reader = -> { Libc.jemalloc_allocated }
        elsif Libc.mallinfo2?
          @source = "glibc mallinfo2 (uordblks + hblkhd)"
          @reader = lambda do
            fields = Libc.mallinfo2_fields
            fields[7] + fields[4]
          end
        else
          @source = "GC.stat(:malloc_increase_bytes)"
          @reader = -> { GC.stat(:malloc_increase_bytes) }
        end
      end

      def bytes = @reader.call
    end
  end
end
