# frozen_string_literal: true

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
        @source = "GC.stat(:malloc_increase_bytes)"
        @reader = -> { GC.stat(:malloc_increase_bytes) }
        begin
          require "fiddle"
          require "rbconfig"
          jemalloc || glibc
        rescue LoadError, Fiddle::DLError
          nil # no Fiddle or no symbol: keep the proxy
        end
      end

      def bytes = @reader.call

      private

      def jemalloc
        mallctl = Fiddle::Function.new(Fiddle::Handle::DEFAULT["mallctl"],
                                       [Fiddle::TYPE_VOIDP, Fiddle::TYPE_VOIDP, Fiddle::TYPE_VOIDP,
                                        Fiddle::TYPE_VOIDP, Fiddle::TYPE_SIZE_T], Fiddle::TYPE_INT)
        value = Fiddle::Pointer.malloc(8, Fiddle::RUBY_FREE)
        size = Fiddle::Pointer.malloc(8, Fiddle::RUBY_FREE)
        epoch = Fiddle::Pointer.malloc(8, Fiddle::RUBY_FREE)
        epoch[0, 8] = [1].pack("Q")
        read = lambda do
          # jemalloc caches its statistics; writing "epoch" refreshes them.
          mallctl.call("epoch", nil, nil, epoch, 8)
          size[0, 8] = [8].pack("Q")
          mallctl.call("stats.allocated", value, size, nil, 0).zero? ? value[0, 8].unpack1("Q") : nil
        end
        return false unless read.call

        @source = "jemalloc stats.allocated"
        @reader = read
      rescue Fiddle::DLError
        false
      end

      # struct mallinfo2 is ten size_t fields; uordblks (in-use bytes in the
      # arenas) is the 8th and hblkhd (bytes in mmap'd chunks) the 5th. Fiddle
      # cannot return a struct by value, but the x86-64 SysV ABI returns one
      # this large through a hidden pointer passed as the first argument, so
      # the call is made as `void *mallinfo2(void *buf)`. Other ABIs (aarch64
      # uses x8, not x0) keep the proxy rather than risk a wild write.
      def glibc
        return false unless RbConfig::CONFIG["host_cpu"] == "x86_64"

        fn = Fiddle::Function.new(Fiddle::Handle::DEFAULT["mallinfo2"], [Fiddle::TYPE_VOIDP], Fiddle::TYPE_VOIDP)
        buf = Fiddle::Pointer.malloc(80, Fiddle::RUBY_FREE)
        read = lambda do
          fn.call(buf)
          fields = buf[0, 80].unpack("Q10")
          fields[7] + fields[4]
        end
        read.call
        @source = "glibc mallinfo2 (uordblks + hblkhd)"
        @reader = read
      rescue Fiddle::DLError
        false
      end
    end
  end
end
