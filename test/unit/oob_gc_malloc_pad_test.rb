# frozen_string_literal: true

require "test_helper"
require "memkit/oob_gc"

# The pad glibc keeps at an arena's top: made-up byte counts and a libc
# that records what it was asked, no mallopt.
class OobGCMallocPadTest < Minitest::Test
  MB = 1 << 20

  class FakeLibc
    attr_reader :calls

    def initialize(*answers, mallopt: true)
      @answers = answers
      @mallopt = mallopt
      @calls = []
    end

    def mallopt? = @mallopt

    def mallopt_top_pad(bytes)
      @calls << bytes
      @answers.empty? ? true : @answers.shift
    end
  end

  def test_the_pad_covers_twice_what_a_gc_frees_in_whole_mebibytes
    libc = FakeLibc.new
    pad = Memkit::OobGC::MallocPad.new(max_bytes: 64 * MB, libc: libc)
    assert_equal 0, pad.bytes
    assert_equal 11 * MB, pad.cover((5 * MB) + 1)
    assert_equal [11 * MB], libc.calls
  end

  def test_it_only_grows_and_asks_glibc_only_when_it_does
    libc = FakeLibc.new
    pad = Memkit::OobGC::MallocPad.new(max_bytes: 64 * MB, libc: libc)
    pad.cover(8 * MB)
    assert_equal 16 * MB, pad.cover(3 * MB), "a smaller GC keeps the pad"
    assert_equal 16 * MB, pad.cover(8 * MB)
    assert_equal 20 * MB, pad.cover(10 * MB)
    assert_equal [16 * MB, 20 * MB], libc.calls
  end

  def test_the_bound_holds
    libc = FakeLibc.new
    pad = Memkit::OobGC::MallocPad.new(max_bytes: 64 * MB, libc: libc)
    assert_equal 64 * MB, pad.cover(500 * MB)
    assert_equal 64 * MB, pad.cover(900 * MB)
    assert_equal [64 * MB], libc.calls
    huge = Memkit::OobGC::MallocPad.new(max_bytes: 8 << 30, libc: FakeLibc.new)
    assert_equal (1 << 31) - 1, huge.cover(8 << 30), "mallopt takes an int"
  end

  def test_refused_or_unavailable_it_never_asks_again
    [false, nil].each do |answer|
      libc = FakeLibc.new(answer)
      pad = Memkit::OobGC::MallocPad.new(max_bytes: 64 * MB, libc: libc)
      assert_equal 0, pad.cover(8 * MB)
      assert_equal 0, pad.cover(30 * MB)
      assert_equal [16 * MB], libc.calls, "answer #{answer.inspect}"
    end
  end

  def test_without_mallopt_it_never_asks
    libc = FakeLibc.new(mallopt: false)
    pad = Memkit::OobGC::MallocPad.new(max_bytes: 64 * MB, libc: libc)
    assert_equal 0, pad.cover(8 * MB)
    assert_empty libc.calls
  end

  def test_nothing_freed_sets_nothing
    libc = FakeLibc.new
    assert_equal 0, Memkit::OobGC::MallocPad.new(max_bytes: 64 * MB, libc: libc).cover(0)
    assert_empty libc.calls
  end
end
