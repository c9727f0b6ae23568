# frozen_string_literal: true

require "test_helper"
require "memkit/oob_gc"

# The heap growth's bound from measured RSS: made-up readings, no GC.
class OobGCRssBudgetTest < Minitest::Test
  MB = 1 << 20

  def test_first_reading_sets_the_level_and_allows_the_share
    budget = Memkit::OobGC::RssBudget.new(share: 0.2)
    assert_equal 20 * MB, budget.bytes(100 * MB, 0)
    assert_equal 100 * MB, budget.base
    assert_equal 25 * MB, budget.bytes(95 * MB, 0), "the level is the highest top before growth"
    assert_equal 22 * MB, budget.bytes(110 * MB, 0), "before any growth, the level follows the top"
    assert_equal 110 * MB, budget.base
  end

  # Pages that cost twice their bytes in RSS (the garbage held between GCs)
  # leave room for half as many more.
  def test_each_page_byte_is_charged_what_the_grown_ones_cost
    budget = Memkit::OobGC::RssBudget.new(share: 0.2)
    budget.bytes(100 * MB, 0)
    assert_equal 5 * MB, budget.bytes(110 * MB, 5 * MB)
    assert_equal 100 * MB, budget.base, "grown: the level stays"

    assert_equal 18 * MB, budget.bytes(102 * MB, 5 * MB), "never less than a byte per byte"
    assert_equal 0, budget.bytes(125 * MB, 10 * MB), "past the bound: nothing more"
  end

  def test_heap_growth_budget_is_the_least_of_max_and_allowed
    growth = Memkit::OobGC::HeapGrowth.new(max_bytes: 64 * MB)
    assert_equal 64 * MB, growth.budget
    growth.allow(10 * MB)
    assert_equal 10 * MB, growth.budget
    growth.record(4 * MB)
    assert_equal 6 * MB, growth.budget
    growth.allow(100 * MB)
    assert_equal 60 * MB, growth.budget
    growth.allow(-5)
    assert_equal 0, growth.budget
  end
end
