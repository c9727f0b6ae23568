# frozen_string_literal: true

require "test_helper"
require "memkit/libc"

class LibcTest < Minitest::Test
  Libc = Memkit::Libc
  LIB = File.expand_path("../../lib", __dir__)

  def glibc?
    File.read("/proc/self/maps").match?(%r{/libc[.-]}) && !File.read("/proc/self/maps").include?("musl")
  end

  def test_predicates_agree_with_the_calls
    assert_equal Libc.malloc_trim?, !Libc.malloc_trim.nil?
    assert_equal Libc.mallinfo2?, !Libc.mallinfo2.nil?
    assert_equal Libc.jemalloc?, !Libc.jemalloc_allocated.nil?
  end

  def test_glibc_on_x86_64_has_both
    cpu = RbConfig::CONFIG["host_cpu"]
    skip "needs glibc on x86-64 (this is #{cpu})" unless glibc? && cpu == "x86_64"

    assert Libc.malloc_trim?
    assert Libc.mallinfo2?
    assert Libc.mallopt?
  end

  def test_mallinfo2_sees_a_large_malloc_in_use_and_freed
    skip "no mallinfo2 here (glibc 2.33+ on x86-64)" unless Libc.mallinfo2?

    # mallinfo2 counts every arena: threads other tests leave running in
    # this process malloc and free while it counts.
    in_fresh_process do
      GC.start
      before = Libc.mallinfo2.in_use
      during = in_use_with_a_string(64 << 20)
      # Within a MiB: whatever else was freed between the two readings.
      assert_operator during - before, :>=, (64 << 20) - (1 << 20)
      GC.start
      assert_operator Libc.mallinfo2.in_use, :<, during - (32 << 20), "freed 64 MiB should leave malloc's in-use count"
    end
  end

  # malloc's in-use bytes while a String of `bytes` (one malloc, mmap'd by
  # glibc above its threshold) lives; String#clear then frees it. Left to
  # GC.start, a copy of the pointer on the stack (Ruby marks the stack
  # conservatively) kept the String alive in one full 3.3 lane.
  def in_use_with_a_string(bytes)
    big = "x" * bytes
    Libc.mallinfo2.in_use.tap { big.clear }
  end

  def test_mallinfo2_fields_are_the_structs_fields
    skip "no mallinfo2 here (glibc 2.33+ on x86-64)" unless Libc.mallinfo2?

    fields = Libc.mallinfo2_fields
    assert_equal 10, fields.size
    assert(fields.all? { |f| f.is_a?(Integer) && f >= 0 })
    assert_equal Libc::Mallinfo2.members.size, fields.size
  end

  def test_malloc_trim_returns_a_boolean_where_available
    skip "no malloc_trim here (musl, macOS)" unless Libc.malloc_trim?

    assert_includes [true, false], Libc.malloc_trim
  end

  # In a fresh process (glibc's thresholds as at start): 40 MB of blocks
  # below the mmap threshold, freed at once, go back to the kernel; with a
  # 64 MB top pad they stay, for the next ones to reuse.
  def test_a_top_pad_keeps_freed_memory_at_the_top_of_the_heap
    skip "needs glibc" unless glibc?

    script = <<~'RUBY'
      require "memkit/libc"
      rss = -> { File.read("/proc/self/statm").split[1].to_i * 4096 }
      pad = ARGV[0] == "pad" ? Memkit::Libc.mallopt_top_pad(64 << 20) : nil
      blocks = Array.new(400) { "x" * 100_000 }
      before = rss.()
      blocks = nil
      GC.start
      puts [pad.inspect, (before - rss.()) >> 20, blocks.inspect].join(" ")
    RUBY
    released = %w[none pad].to_h do |mode|
      out, err, status = Open3.capture3(RbConfig.ruby, "--disable-gems", "-I", LIB, "-e", script, mode)
      assert status.success?, err
      set, mb, = out.split
      assert_equal mode == "pad" ? "true" : "nil", set
      [mode, mb.to_i]
    end
    assert_operator released.fetch("none"), :>=, 30, released
    assert_operator released.fetch("pad"), :<=, 5, released
  end

  def test_malloc_address_and_program_break_are_integers
    skip "needs glibc" unless glibc?

    address = Libc.malloc_address(16)
    assert_kind_of Integer, address
    refute_equal 0, address
    assert_operator Libc.program_break, :>, 0
  end

  def test_without_fiddle_everything_is_unavailable_not_an_error
    script = <<~'RUBY'
      module Kernel
        alias_method :memkit_require, :require
        def require(name)
          raise LoadError, "cannot load such file -- fiddle" if name == "fiddle"

          memkit_require(name)
        end
      end
      require "memkit/libc"
      l = Memkit::Libc
      p [l.malloc_trim?, l.malloc_trim, l.mallinfo2?, l.mallinfo2, l.jemalloc?, l.program_break,
         l.mallopt?, l.mallopt_top_pad(1 << 20)]
    RUBY
    out, err, status = Open3.capture3(RbConfig.ruby, "-I", LIB, "-e", script)
    assert status.success?, err
    assert_equal "[false, nil, false, nil, false, nil, false, nil]\n", out
  end

  def test_jemalloc_is_seen_when_preloaded
    lib = Dir["/usr/lib/*/libjemalloc.so.2"].first
    skip "needs libjemalloc2 (apt-get install libjemalloc2)" unless lib

    out, err, status = Open3.capture3({ "LD_PRELOAD" => lib }, RbConfig.ruby, "-I", LIB, "-rmemkit/libc",
                                      "-e", "p Memkit::Libc.jemalloc_allocated.class")
    assert status.success?, err
    assert_equal "Integer\n", out
  end
end
