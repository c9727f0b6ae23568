# frozen_string_literal: true

require "rbconfig"

module Memkit
  # The C library calls memkit makes through Fiddle, each bound once.
  #
  # One policy for every binding: a function is bound the first time it is
  # needed; if Fiddle is missing (LoadError) or the symbol is not in the
  # process (Fiddle::DLError: musl has no malloc_trim, glibc before 2.33 no
  # mallinfo2, jemalloc is not preloaded), it is unavailable, its predicate
  # says false and its call returns nil. Nothing else is rescued: a failure
  # inside a bound call is a bug to see, not a missing feature.
  #
  #   Memkit::Libc.malloc_trim?          # => true on glibc
  #   Memkit::Libc.malloc_trim           # => true if glibc released memory, nil if unavailable
  #   Memkit::Libc.mallinfo2&.uordblks   # bytes in use in malloc's arenas
  module Libc
    # glibc's struct mallinfo2: ten size_t fields, in bytes (counts for
    # arena/ordblks/smblks/hblks). uordblks is in use in the arenas, hblkhd
    # in mmap'd chunks, keepcost the releasable top of the main heap.
    Mallinfo2 = Struct.new(:arena, :ordblks, :smblks, :hblks, :hblkhd, :usmblks, :fsmblks, :uordblks, :fordblks,
                           :keepcost) do
      # Bytes malloc has handed out and not got back: arenas plus mmap'd chunks.
      def in_use = uordblks + hblkhd
    end

    MALLINFO2_BYTES = 80
    M_TOP_PAD = -2 # malloc.h
    private_constant :MALLINFO2_BYTES, :M_TOP_PAD

    @functions = {}

    class << self
      def malloc_trim? = !function(:malloc_trim).nil?

      # Asks glibc to return free heap memory to the kernel (malloc_trim(0)).
      # true if it released some, false if there was none to release, nil
      # where there is no malloc_trim (musl, macOS).
      def malloc_trim
        fn = function(:malloc_trim) or return nil
        fn.call(0) == 1
      end

      def mallopt? = !function(:mallopt).nil?

      # glibc's M_TOP_PAD: the free bytes each arena keeps at its top when it
      # gives memory back to the kernel (see OobGC::MallocPad). true if set,
      # false if refused (musl's mallopt refuses all), nil where unavailable.
      def mallopt_top_pad(bytes)
        fn = function(:mallopt) or return nil
        fn.call(M_TOP_PAD, bytes) == 1
      end

      # mallinfo2 fills a struct that Fiddle cannot return by value. The
      # x86-64 System V ABI returns a struct this large through a hidden
      # pointer passed as the first argument, so the call is made as
      # `void mallinfo2(void *out)`. Other ABIs (aarch64 passes it in x8, not
      # x0) say unavailable rather than risk a wild write.
      def mallinfo2? = !function(:mallinfo2).nil?

      # A Mallinfo2 for this process, or nil where mallinfo2 is unavailable.
      def mallinfo2
        fields = mallinfo2_fields or return nil
        Mallinfo2.new(*fields)
      end

      # The ten fields as an Array of Integers, into a buffer reused per
      # thread, for callers that sample often.
      def mallinfo2_fields
        fn = function(:mallinfo2) or return nil
        buffer, = scratch(:memkit_mallinfo2, 1, MALLINFO2_BYTES)
        fn.call(buffer)
        buffer[0, MALLINFO2_BYTES].unpack("Q10")
      end

      # jemalloc's "stats.allocated" (bytes handed out and not freed), or nil
      # where jemalloc is not loaded (LD_PRELOAD or linked).
      def jemalloc_allocated
        fn = function(:mallctl) or return nil
        value, size, epoch = scratch(:memkit_mallctl, 3, 8)
        # jemalloc caches its statistics; writing "epoch" refreshes them.
        epoch[0, 8] = [1].pack("Q")
        fn.call("epoch", nil, nil, epoch, 8)
        size[0, 8] = [8].pack("Q")
        fn.call("stats.allocated", value, size, nil, 0).zero? ? value[0, 8].unpack1("Q") : nil
      end

      def jemalloc? = !jemalloc_allocated.nil?

      # malloc(size) as an address Integer, never freed; 0 when malloc failed.
      # For Warmup's hole filling: a Fiddle::Pointer per call would itself be
      # garbage in the heap being prepared. nil where unavailable.
      def malloc_address(size)
        fn = function(:malloc) or return nil
        fn.call(size)
      end

      # The program break (sbrk(0)): the end of glibc's main heap. nil where unavailable.
      def program_break
        fn = function(:sbrk) or return nil
        fn.call(0)
      end

      private

      # `count` buffers of `bytes` each, made once per thread: a sampler that
      # reads these often should not allocate for every reading.
      def scratch(key, count, bytes)
        thread = Thread.current
        thread.thread_variable_get(key) ||
          thread.thread_variable_set(key, Array.new(count) { Fiddle::Pointer.malloc(bytes, Fiddle::RUBY_FREE) })
      end

      # Two threads binding the same name at once both get a working
      # function; the second one is kept.
      def function(name)
        return @functions[name] if @functions.key?(name)

        @functions[name] = bind(name)
      end

      def bind(name)
        return nil unless fiddle?
        return nil if name == :mallinfo2 && RbConfig::CONFIG["host_cpu"] != "x86_64"

        args, ret = signature(name)
        Fiddle::Function.new(Fiddle::Handle::DEFAULT[name.to_s], args, ret)
      rescue Fiddle::DLError
        nil
      end

      def fiddle?
        require "fiddle"
        true
      rescue LoadError
        false
      end

      def signature(name)
        f = Fiddle
        case name
        when :malloc_trim then [[f::TYPE_SIZE_T], f::TYPE_INT]
        when :mallopt then [[f::TYPE_INT, f::TYPE_INT], f::TYPE_INT]
        when :mallinfo2 then [[f::TYPE_VOIDP], f::TYPE_VOID]
        when :mallctl then [[f::TYPE_VOIDP, f::TYPE_VOIDP, f::TYPE_VOIDP, f::TYPE_VOIDP, f::TYPE_SIZE_T], f::TYPE_INT]
        # Addresses as Integers (size_t), not Fiddle::Pointer objects.
        when :malloc then [[f::TYPE_SIZE_T], f::TYPE_SIZE_T]
        when :sbrk then [[f::TYPE_LONG], f::TYPE_SIZE_T]
        else raise ArgumentError, "Memkit::Libc: no binding for #{name}"
        end
      end
    end
  end
end
