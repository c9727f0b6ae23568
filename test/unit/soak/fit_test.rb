# frozen_string_literal: true

require "test_helper"

# The estimator and the verdict on curves whose answer is known.
class SoakFitTest < Minitest::Test
  Fit = Memkit::Soak::Fit
  Verdict = Memkit::Soak::Verdict

  def xs(n = 100, step = 100) = Array.new(n) { |i| i * step }

  def test_exact_line
    fit = Fit.of(xs, xs.map { |x| 1_000_000 + 400 * x })
    assert_in_delta 400.0, fit.slope, 1e-9
    assert_in_delta 400.0, fit.low, 1e-9
    assert_in_delta 400.0, fit.high, 1e-9
    assert_in_delta 1_000_000, fit.predict(0), 1e-6
  end

  def test_outliers_do_not_move_the_slope
    ys = xs.map { |x| 1_000_000 + 400 * x }
    # A fifth of the samples jump by 5 MB, as after a heap growth or a trim.
    ys = ys.each_with_index.map { |y, i| (i % 5).zero? ? y + 5_000_000 : y }
    fit = Fit.of(xs, ys)
    assert_in_delta 400.0, fit.slope, 1.0
    ols = least_squares_slope(xs, ys)
    assert_in_delta 400.0, ols, 100.0, "sanity: the outliers are not symmetric enough to cancel in OLS either"
  end

  def test_interval_covers_the_truth_under_noise_and_narrows_with_more_samples
    rng = Random.new(7)
    noisy = ->(n) { x = xs(n); [x, x.map { |v| 30_000_000 + 400 * v + rng.rand(-200_000..200_000) }] }
    small = Fit.of(*noisy.call(30))
    large = Fit.of(*noisy.call(300))
    [small, large].each { |f| assert_operator f.low, :<=, 400; assert_operator f.high, :>=, 400 }
    assert_operator large.high - large.low, :<, small.high - small.low
  end

  # A cache filling up (growth that slows down) sampled 200 times: read as
  # independent samples its interval would be a few bytes wide and exclude
  # the flat future. The residuals around a line through a bend are
  # correlated, and the interval widens by the effective sample size.
  def test_a_bending_curve_gets_a_wide_interval
    x = xs(200, 10)
    ys = x.map { |v| (2_000_000 * (1 - Math.exp(-v / 1_500.0))).round }
    fit = Fit.of(x, ys)
    assert_operator fit.autocorrelation, :>, 0.9
    assert_operator fit.n / fit.inflation, :<, 10, "200 correlated samples are worth a few independent ones"
    naive_width = 0.05 * fit.slope
    assert_operator fit.high - fit.low, :>, 5 * naive_width, fit.to_h.inspect
  end

  # Independent jitter around a straight line keeps its narrow interval, and
  # so does a line that is exact except for one jump (the median ignores it).
  def test_independent_noise_and_a_single_step_are_not_widened
    rng = Random.new(3)
    x = xs(200)
    jitter = Fit.of(x, x.map { |v| 400 * v + rng.rand(-20_000..20_000) })
    assert_operator jitter.autocorrelation.abs, :<, 0.3
    assert_operator jitter.inflation, :<, 1.8
    assert_operator jitter.high - jitter.low, :<, 20

    step = Fit.of(x, x.each_with_index.map { |v, i| 1_000_000 + (i > 150 ? 1_200_000 : 0) + 0 * v })
    assert_equal 0.0, step.slope
    assert_equal 1.0, step.inflation
  end

  # A cache of 3,000 entries fills in a straight line for 3,000 requests:
  # over a window that short a leak and a filling cache look the same.
  def test_a_straight_line_over_a_short_window_is_inconclusive_not_leak
    short = xs(40, 75) # 2,925 requests
    v = Verdict.judge(short, short.map { |x| 5_000_000 + 1_000 * x }, min_leak: 64)
    assert_equal "inconclusive", v.verdict
    assert_match(/too few to tell a leak from a cache still filling/, v.reason)
    long = xs(40, 110) # 4,290 requests
    assert_equal "leak", Verdict.judge(long, long.map { |x| 5_000_000 + 1_000 * x }, min_leak: 64).verdict
  end

  # Flat over 10 requests says nothing: a 400 B/request leak adds a page.
  # A plateau needs a last half long enough for min_leak to add 32 KiB.
  def test_flat_over_too_few_requests_is_inconclusive_not_plateau
    short = xs(10, 1)
    v = Verdict.judge(short, short.map { 5_000_000 }, min_leak: 64)
    assert_equal "inconclusive", v.verdict
    assert_match(/too little to see/, v.reason)
    long = xs(20, 60) # last half: 600 requests, 64 x 600 = 37.5 KiB
    assert_equal "plateau", Verdict.judge(long, long.map { 5_000_000 }, min_leak: 64).verdict
  end

  def test_to_h_reports_the_effective_sample_count
    x = xs(50)
    h = Fit.of(x, x.map { |v| 3 * v }).to_h
    assert_equal 50, h[:samples]
    assert_equal 50.0, h[:effective_samples]
  end

  def test_many_samples_use_sampled_pairs_and_stay_accurate
    x = xs(1_000, 10)
    fit = Fit.of(x, x.map { |v| 50 * v + (v % 7) * 1000 })
    assert_in_delta 50.0, fit.slope, 5.0
    assert_operator fit.low, :<=, fit.high
  end

  def test_verdict_leak_for_steady_growth
    v = Verdict.judge(xs, xs.map { |x| 20_000_000 + 400 * x + (x % 300) * 50 }, min_leak: 64)
    assert_equal "leak", v.verdict, v.reason
    assert_match(/400 B\/request/, v.reason)
  end

  def test_verdict_plateau_for_flat_and_for_filled_cache
    flat = Verdict.judge(xs, xs.map { |x| 20_000_000 + (x % 700) * 100 }, min_leak: 64)
    assert_equal "plateau", flat.verdict, flat.reason
    # Fills for the first 30% of the window, then flat: never a leak.
    filled = Verdict.judge(xs, xs.map { |x| 20_000_000 + 2_000 * [x, 3_000].min }, min_leak: 64)
    assert_equal "plateau", filled.verdict, filled.reason
    assert_match(/flat/, filled.reason)
  end

  def test_verdict_plateau_when_the_cache_fills_during_the_window
    # Fills for the first 30% of the window (the whole-window slope is far
    # above min_leak), then flat: the last half decides.
    filled = Verdict.judge(xs, xs.map { |x| 20_000_000 + 8_000 * [x, 3_000].min }, min_leak: 64)
    assert_equal "plateau", filled.verdict, filled.reason
    assert_match(/flat/, filled.reason)
  end

  def test_verdict_inconclusive_with_too_few_samples
    few = Verdict.judge([0, 1, 2], [1, 2, 3], min_leak: 64)
    assert_equal "inconclusive", few.verdict
    assert_match(/only 3 samples/, few.reason)
  end

  def test_verdict_inconclusive_when_growth_is_within_noise
    rng = Random.new(3)
    ys = xs.map { |x| 20_000_000 + 100 * x + rng.rand(-4_000_000..4_000_000) }
    v = Verdict.judge(xs, ys, min_leak: 64)
    assert_equal "inconclusive", v.verdict, v.reason
  end

  private

  def least_squares_slope(x, y)
    mx = x.sum.fdiv(x.size)
    my = y.sum.fdiv(y.size)
    x.zip(y).sum { |a, b| (a - mx) * (b - my) } / x.sum { |a| (a - mx)**2 }
  end
end
