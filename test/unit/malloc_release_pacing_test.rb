# frozen_string_literal: true

require "test_helper"

# Memkit::MallocRelease::Pacing with made-up RSS readings around trims.
class MallocReleasePacingTest < Minitest::Test
  MB = 1 << 20

  def pacing = Memkit::MallocRelease::Pacing.new

  # Trims `count` majors in a row, each RSS growing back to `high` before
  # and falling to `low` after; returns which majors trimmed.
  def run_majors(pace, count, high:, low:)
    Array.new(count) do
      next false unless pace.trim?

      pace.trimmed(high, low)
      true
    end
  end

  # Trims once per [before, after] reading, each at a major that must
  # trim; returns the wait that leaves.
  def wait_after(*readings)
    pace = pacing
    readings.each do |before, after|
      assert pace.trim?
      pace.trimmed(before, after)
    end
    pace.wait
  end

  def test_memory_that_stays_given_back_trims_every_major
    readings = [[200 * MB, 120 * MB]] + [125, 122, 130].map { |rss| [rss * MB, 118 * MB] }
    assert_equal 0, wait_after(*readings)
  end

  def test_memory_that_grows_back_spaces_the_trims_out_doubling
    pace = pacing
    trims = run_majors(pace, 16, high: 150 * MB, low: 100 * MB)
    # The first two trim (the second finds the first's 50 MB back); then
    # waits of 1, 2, 4 and 8 majors.
    expected = [true, true, false, true, false, false, true, false, false, false, false, true, false, false, false, false]
    assert_equal expected, trims
    assert_equal 8, pace.wait
  end

  def test_the_wait_stops_at_max_wait
    pace = pacing
    run_majors(pace, 1000, high: 150 * MB, low: 100 * MB)
    assert_equal Memkit::MallocRelease::Pacing::MAX_WAIT, pace.wait
  end

  def test_a_trim_whose_memory_stays_away_ends_the_wait
    pace = pacing
    run_majors(pace, 8, high: 150 * MB, low: 100 * MB)
    assert_equal 4, pace.wait
    pace.trim? until pace.trim?
    pace.trimmed(110 * MB, 100 * MB) # 10 MB back of the 50 the last trim gave back
    assert_equal 0, pace.wait
    assert pace.trim?
  end

  def test_small_trims_never_start_a_wait
    pace = pacing
    trims = run_majors(pace, 10, high: 107 * MB, low: 100 * MB)
    assert_equal [true] * 10, trims
  end

  def test_growing_back_less_than_half_is_not_churn
    assert_equal 0, wait_after([150 * MB, 100 * MB], [124 * MB, 100 * MB])
  end

  def test_without_rss_readings_every_major_trims
    assert_equal 0, wait_after(*Array.new(5) { [nil, nil] })
  end

  def test_a_trim_that_gave_nothing_back_is_not_churn
    assert_equal 0, wait_after([100 * MB, 100 * MB], [180 * MB, 100 * MB])
  end
end
