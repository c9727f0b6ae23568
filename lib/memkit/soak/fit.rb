# frozen_string_literal: true

module Memkit
  module Soak
    # A straight line through (requests, bytes) that a few outliers cannot
    # move: the Theil–Sen slope (median of all pairwise slopes) with Sen's
    # rank-based 95% confidence interval.
    #
    # Least squares is the wrong tool here: one GC that grows the heap by a
    # page batch, or a malloc trim that returns a megabyte, drags an OLS slope
    # by the whole step. The median of pairwise slopes ignores up to ~29% of
    # wild points.
    #
    # Sen's interval assumes independent errors, and memory samples are not:
    # a heap that grows in page batches, or a cache that fills and then stops,
    # leaves residuals that stay above or below the line for many samples in
    # a row. Read as independent, 200 such samples give an interval a few
    # bytes wide around a slope that the next 5,000 requests take back. So
    # the interval is widened by the variance inflation of Kendall's S under
    # lag-1 autocorrelation of the residuals (Yue & Wang 2004, AR(1) form):
    # Var*(S) = Var(S) * (1 + 2 * sum_k (1 - k/n) * rho^k), the "effective
    # sample size" correction. A curve that bends gets a wide interval; a
    # straight line with independent jitter keeps a narrow one. Verdict also
    # compares the growth with the scatter around the line.
    class Fit
      # 1.96: the normal quantile for a two-sided 95% interval.
      Z95 = 1.959964
      # Beyond this many samples the O(n^2) pairs are sampled instead of
      # enumerated; 400 samples are 79,800 pairs, a few ms.
      MAX_PAIRS = 80_000

      attr_reader :slope, :intercept, :low, :high, :n, :noise, :autocorrelation, :inflation

      def self.of(xs, ys) = new(xs, ys)

      def initialize(xs, ys)
        raise ArgumentError, "xs and ys differ in length" unless xs.size == ys.size

        @n = xs.size
        slopes = pair_slopes(xs, ys)
        if slopes.empty?
          @slope = @low = @high = 0.0
          @intercept = ys.empty? ? 0.0 : median(ys.map(&:to_f))
          @noise = 0.0
          @autocorrelation = 0.0
          @inflation = 1.0
          return freeze
        end
        slopes.sort!
        @slope = median_sorted(slopes)
        @intercept = median(xs.each_index.map { |i| ys[i] - @slope * xs[i] })
        residuals = xs.each_index.map { |i| ys[i] - predict(xs[i]) }
        # Robust scatter around the line: 1.4826 * MAD estimates sigma for
        # Gaussian noise without letting the occasional jump inflate it.
        @noise = 1.4826 * median(residuals.map(&:abs))
        # The dependence is measured on residuals clipped at 3 sigma, for the
        # reason the slope is a median: one jump (a hash table resized once)
        # would otherwise read as a whole run of correlated samples. A curve
        # that bends moves most residuals within the clip and keeps its
        # correlation; one that sits on its line except for a step has none.
        clip = 3 * @noise
        @autocorrelation = lag1(residuals.map { |r| r.clamp(-clip, clip) })
        @inflation = variance_inflation(@autocorrelation)
        @low, @high = sen_interval(slopes)
        freeze
      end

      def predict(x) = @intercept + @slope * x

      def to_h
        { slope: @slope.round(3), low: @low.round(3), high: @high.round(3), intercept: @intercept.round,
          noise: @noise.round, samples: @n, autocorrelation: @autocorrelation.round(3),
          effective_samples: (@n / @inflation).round(1) }
      end

      private

      def pair_slopes(xs, ys)
        pairs = @n * (@n - 1) / 2
        slopes = []
        if pairs <= MAX_PAIRS
          (0...@n).each do |i|
            xi = xs[i]
            yi = ys[i]
            ((i + 1)...@n).each do |j|
              dx = xs[j] - xi
              slopes << (ys[j] - yi).fdiv(dx) unless dx.zero?
            end
          end
        else
          # A fixed seed keeps the answer reproducible run to run.
          rng = Random.new(2012)
          @sampled_pairs = MAX_PAIRS
          MAX_PAIRS.times do
            i = rng.rand(@n)
            j = rng.rand(@n)
            dx = xs[j] - xs[i]
            slopes << (ys[j] - ys[i]).fdiv(dx) unless dx.zero?
          end
        end
        slopes
      end

      # Sen (1968): the interval's ends are order statistics of the sorted
      # slopes, offset from the middle by z * sqrt(Var S) / 2, where S is
      # Kendall's statistic with Var S = n(n-1)(2n+5)/18 (no ties).
      def sen_interval(sorted)
        count = sorted.size
        var_s = @n * (@n - 1) * (2 * @n + 5) / 18.0
        c = Z95 * Math.sqrt(var_s)
        # When the pairs were sampled, scale the offset to the sample size.
        c *= count.fdiv(@n * (@n - 1) / 2) if @sampled_pairs
        c *= Math.sqrt(@inflation)
        lower = ((count - c) / 2.0).floor.clamp(0, count - 1)
        upper = ((count + c) / 2.0).ceil.clamp(0, count - 1)
        [sorted[lower], sorted[upper]]
      end

      # Lag-1 autocorrelation of the residuals in sample order; 0 when they
      # have no spread (a perfectly straight line).
      def lag1(residuals)
        return 0.0 if residuals.size < 3

        mean = residuals.sum.fdiv(residuals.size)
        d = residuals.map { |r| r - mean }
        denominator = d.sum { |v| v * v }
        return 0.0 if denominator.zero?

        (1...d.size).sum { |i| d[i] * d[i - 1] } / denominator
      end

      # How much positive lag-1 autocorrelation inflates Var(S); never below
      # 1 (negative correlation is not taken as extra precision), never above
      # n (n samples are worth at least one).
      def variance_inflation(rho)
        return 1.0 unless rho.positive?

        factor = 1.0 + 2.0 * (1...@n).sum { |k| (1.0 - k.fdiv(@n)) * rho**k }
        factor.clamp(1.0, @n.to_f)
      end

      def median(values) = values.empty? ? 0.0 : median_sorted(values.sort)

      def median_sorted(sorted)
        mid = sorted.size / 2
        sorted.size.odd? ? sorted[mid].to_f : (sorted[mid - 1] + sorted[mid]) / 2.0
      end
    end
  end
end
