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
