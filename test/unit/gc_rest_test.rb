# frozen_string_literal: true

require "test_helper"
require "memkit/gc_rest"

class GCRestTest < Minitest::Test
  def test_finishes_a_lazy_sweep
    keep = Array.new(300_000) { |i| [i] }
    # A GC that allocation starts sweeps lazily (GC.start sweeps at once).
    count = GC.count
    Object.new while GC.count == count
    skip "this GC left nothing to sweep" unless GC.latest_gc_info(:state) == :sweeping

    Memkit::GCRest.finish
    assert_equal :none, GC.latest_gc_info(:state)
    refute GC.disable, "GC is on again"
    assert_equal 300_000, keep.size
  ensure
    GC.enable
  end

  def test_leaves_gc_off_where_it_was_off
    GC.disable
    Memkit::GCRest.finish
    assert GC.enable, "GC was still off"
  ensure
    GC.enable
  end
end
