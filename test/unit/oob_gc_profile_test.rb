# frozen_string_literal: true

require "test_helper"
require "memkit/oob_gc"

class OobGCProfileTest < Minitest::Test
  Profile = Memkit::OobGC::Profile

  def test_a_high_percentile_not_the_mean_nor_the_max
    profile = Profile.new(window: 200, percentile: 0.95)
    Profile::SETTLED.times { profile.record([50_000, 50], 500) } # 16 of them stay
    (1..100).to_a.shuffle(random: Random.new(1)).each { |n| profile.record([n * 1_000, n], n * 10) }
    # The figures are taken again once a quarter of the window is new: of
    # 150 requests, the 8th largest.
    34.times { profile.record([50_000, 50], 500) }
    assert_equal [93_000, 93], profile.objects
    assert_equal 930, profile.malloc
    # One huge request moves the percentile by one step, not to itself:
    # one above the pool it did not allocate in.
    profile.record([10_000_000, 0], 0)
    49.times { profile.record([50_000, 50], 500) }
    assert_equal [92_000, 91], profile.objects
  end

  # The first requests count while they are all there is, then leave.
  def test_forgets_a_workers_first_requests_once_settled
    profile = Profile.new(window: 200)
    profile.record([90_000, 27_000], 4_000_000)
    (Profile::FIRST - 1).times { profile.record([40_000, 900], 100_000) }
    assert_equal [90_000, 27_000], profile.objects
    assert_equal 4_000_000, profile.malloc
    (Profile::SETTLED - Profile::FIRST - 1).times { profile.record([30_000, 800], 80_000) }
    refute_predicate profile, :settled?
    version = profile.version
    profile.record([30_000, 800], nil)
    assert_predicate profile, :settled?
    assert_equal [30_000, 800], profile.objects
    assert_equal 80_000, profile.malloc
    assert_equal Profile::SETTLED - Profile::FIRST, profile.size
    refute_equal version, profile.version
    # The window goes on from there.
    profile.record([31_000, 800], 80_000)
    assert_equal Profile::SETTLED - Profile::FIRST + 1, profile.size
  end

  # A window smaller than the first requests has forgotten them already.
  def test_a_small_window_settles_in_order
    profile = Profile.new(window: 10)
    Profile::SETTLED.times { |i| profile.record([i], 0) }
    assert_predicate profile, :settled?
    assert_equal 10, profile.size
    profile.record([0], 0)
    assert_equal [Profile::SETTLED - 1], profile.objects
  end

  # The collector keeps a decision for as long as the figures it came from.
  def test_version_moves_only_when_the_figures_do
    profile = Profile.new(window: 50)
    50.times { profile.record([1_000, 10], 100) }
    version = profile.version
    64.times { profile.record([1_000, 10], 100) }
    assert_equal version, profile.version
    16.times { profile.record([9_000, 10], 100) }
    refute_equal version, profile.version
    assert_equal [9_000, 10], profile.objects
  end

  # What requests allocate can shift (memkit demo: ids past 10,000 move a
  # String per row from the 40-byte pool to the 80-byte one, 5 -> 206 objects
  # a request): the figure follows within three requests, long before the
  # window's percentile would; one outlier alone does not move it.
  def test_a_shift_up_moves_the_figure_within_three_requests
    profile = Profile.new(window: 200)
    120.times { profile.record([2_000, 5], 100) }
    version = profile.version
    profile.record([2_000, 988], 100)
    16.times { profile.record([2_000, 5], 100) }
    assert_equal [2_000, 5], profile.objects, "one outlier"
    2.times { profile.record([1_800, 206], 100) }
    assert_equal 5, profile.objects[1], "two heavy requests"
    profile.record([1_800, 206], 100)
    assert_equal [2_000, 206], profile.objects
    refute_equal version, profile.version
  end

  # The recent requests are read across the ring's end: 54 recorded in a
  # window of 40 (16 forgotten as the first) leave the next at its 38th
  # entry, so the three heavy ones straddle the end.
  def test_a_shift_up_across_the_end_of_the_window
    profile = Profile.new(window: 40)
    54.times { profile.record([2_000, 5], 100) }
    2.times { profile.record([2_000, 206], 100) }
    assert_equal [2_000, 5], profile.objects
    profile.record([2_000, 206], 100)
    assert_equal [2_000, 206], profile.objects
    3.times { profile.record([2_000, 5], 5_000) }
    assert_equal 5_000, profile.malloc
  end

  def test_forgets_requests_older_than_the_window
    profile = Profile.new(window: 10)
    10.times { profile.record([100_000], 0) }
    10.times { profile.record([1_000], 0) }
    assert_equal [1_000], profile.objects
    assert_equal 10, profile.size
  end

  # A request during which Ruby collected says nothing of malloc growth.
  def test_malloc_skips_requests_without_a_reading
    profile = Profile.new
    profile.record([1], nil)
    assert_equal 0, profile.malloc
    profile.record([1], 4096)
    assert_equal 4096, profile.malloc
  end

  # How far the window's largest request went past the figure: moved by a
  # new largest at once, and back once it has left the window and the
  # figures are taken again.
  def test_beyond_is_the_largest_request_past_the_figure
    profile = Profile.new(window: 50)
    Profile::SETTLED.times { profile.record([1_000, 0, 300], 0) }
    assert_equal [0, 0, 0], profile.beyond
    version = profile.version
    profile.record([1_700, 0, 300], 0)
    assert_equal [700, 0, 0], profile.beyond
    refute_equal version, profile.version
    assert_equal [1_000, 0, 300], profile.objects, "one request does not move the percentile"
    80.times { profile.record([1_000, 0, 310], 0) }
    assert_equal [0, 0, 0], profile.beyond
    assert_equal [1_000, 0, 310], profile.objects
  end

  # Requests of three sizes, the largest one in 20: that twentieth
  # allocates two thirds of the objects, so the figure covers it, steadily,
  # though the percentile sits at its edge.
  def test_a_tail_that_allocates_most_is_covered
    draw = Random.new(3)
    profile = Profile.new(window: 200)
    figures = []
    600.times do |i|
      r = draw.rand(100)
      objects = if r < 5 then 240_000 elsif r < 30 then 18_000 else 1_800 end
      profile.record([objects], objects * 8)
      figures << profile.objects.first if i >= 300
    end
    assert_operator figures.min, :>=, 150_000
    assert_operator figures.max, :<=, 240_000
    assert_operator profile.malloc, :>=, 150_000 * 8
  end

  # Where the requests past the percentile allocate no more than it leaves
  # out, the figure is the percentile's, as before.
  def test_a_light_tail_leaves_the_percentile
    profile = Profile.new(window: 200)
    Profile::SETTLED.times { profile.record([10_000], 0) }
    200.times { |i| profile.record([i == 7 ? 11_000 : 10_000], 0) }
    assert_equal [10_000], profile.objects
    # Two requests of 100k among 10k ones allocate 9% of the objects, but
    # they are fewer than RANK.
    190.times { profile.record([10_000], 0) }
    2.times { profile.record([100_000], 0) }
    8.times { profile.record([10_000], 0) }
    assert_equal [10_000], profile.objects
    3.times { profile.record([100_000], 0) }
    47.times { profile.record([10_000], 0) }
    assert_operator profile.objects.first, :>, 50_000
  end

  # A pool most requests leave alone and a few take a dozen objects of:
  # that tail is all it allocates, but a dozen slots is no shift.
  def test_a_small_tail_in_a_pool_requests_barely_use_is_no_shift
    profile = Profile.new(window: 200)
    Profile::SETTLED.times { profile.record([10_000, 0], 0) }
    200.times { |i| profile.record([10_000, (i % 25).zero? ? 12 : 0], 0) }
    assert_equal [10_000, 0], profile.objects
  end

  def test_options
    assert_raises(Memkit::InvalidArgument) { Profile.new(window: 0) }
    assert_raises(Memkit::InvalidArgument) { Profile.new(percentile: 0) }
    assert_raises(Memkit::InvalidArgument) { Profile.new(percentile: 1.5) }
  end
end
