# frozen_string_literal: true

require "test_helper"
require "memkit/allocator"

class AllocatorTest < Minitest::Test
  GLIBC_MAPS = <<~MAPS
    55d0c0a00000-55d0c0a01000 r--p 00000000 fe:01 1234 /usr/bin/ruby3.1
    7f1c2a000000-7f1c2a028000 r--p 00000000 fe:01 5678 /usr/lib/x86_64-linux-gnu/libc.so.6
    7f1c2b000000-7f1c2b100000 r-xp 00000000 fe:01 9012 /usr/lib/x86_64-linux-gnu/libruby-3.1.so.3.1.2
  MAPS

  def test_names_the_library_mapped
    assert_equal "glibc", Memkit::Allocator.name_from_maps(GLIBC_MAPS)
    jemalloc = GLIBC_MAPS + "7f1c2c000000-7f1c2c0a0000 r-xp 00000000 fe:01 42 /usr/lib/x86_64-linux-gnu/libjemalloc.so.2\n"
    assert_equal "jemalloc", Memkit::Allocator.name_from_maps(jemalloc)
    assert_equal "tcmalloc", Memkit::Allocator.name_from_maps(GLIBC_MAPS + "7f00-7f01 r-xp 0 0:0 1 /usr/lib/libtcmalloc_minimal.so.4\n")
    assert_equal "mimalloc", Memkit::Allocator.name_from_maps(GLIBC_MAPS + "7f00-7f01 r-xp 0 0:0 1 /usr/lib/libmimalloc.so.2\n")
    # Bytes that are not UTF-8 in a mapped file's name do not stop the scan.
    assert_equal "jemalloc", Memkit::Allocator.name_from_maps("7f00-7f01 r-xp 0 0:0 1 /opt/\xFF/libjemalloc.so.2\n".b)
  end

  def test_arena_settings_from_the_environment
    assert_equal({ arena_max: nil, malloc_conf: nil }, Memkit::Allocator.settings({}))
    assert_equal({ arena_max: "2", malloc_conf: nil }, Memkit::Allocator.settings("MALLOC_ARENA_MAX" => "2"))
    tunables = { "GLIBC_TUNABLES" => "glibc.malloc.trim_threshold=1:glibc.malloc.arena_max=4", "MALLOC_ARENA_MAX" => "2" }
    assert_equal "4", Memkit::Allocator.settings(tunables)[:arena_max]
    assert_equal "narenas:2", Memkit::Allocator.settings("MALLOC_CONF" => "narenas:2")[:malloc_conf]
  end

  def test_environ_parsing_keeps_values_with_equals_signs_and_skips_junk
    env = Memkit::Allocator.environ("A=1\0B=x=y\0junk\0C=\xFF\0".b)
    assert_equal "1", env["A"]
    assert_equal "x=y", env["B"]
    refute env.key?("junk")
    assert env["C"].valid_encoding?
  end

  def test_reads_a_real_process
    skip "no /proc/PID/maps" unless linux?

    allocator = Memkit::Allocator.read(Process.pid)
    assert_equal Memkit::Allocator.name_from_maps(File.read("/proc/self/maps")), allocator.name
    assert allocator.environ_readable
    unless ENV.key?("GLIBC_TUNABLES")
      ENV["MALLOC_ARENA_MAX"] ? assert_equal(ENV["MALLOC_ARENA_MAX"], allocator.arena_max) : assert_nil(allocator.arena_max)
    end
    assert_raises(Memkit::NoSuchProcess) { Memkit::Allocator.read(dead_pid) }
  end

  private

  def dead_pid
    pid = fork { exit!(0) }
    Process.wait(pid)
    pid
  end
end
