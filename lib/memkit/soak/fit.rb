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
    # wild points. Sen's interval assumes independent errors; memory samples
    # are step-shaped and correlated, so Verdict never trusts the interval
    # alone and also compares the growth with the scatter around the line.
    class Fit
      # 1.96: the normal quantile for a two-sided 95% interval.
      Z95 = 1.959964
      # Beyond this many samples the O(n^2) pairs are sampled instead of
      # enumerated; 400 samples are 79,800 pairs, a few ms.
      MAX_PAIRS = 80_000

      attr_reader :slope, :intercept, :low, :high, :n, :noise

      def self.of(xs, ys) = new(xs, ys)

      def initialize(xs, ys)
        raise ArgumentError, "xs and ys differ in length" unless xs.size == ys.size

        @n = xs.size
        slopes = pair_slopes(xs, ys)
        if slopes.empty?
          @slope = @low = @high = 0.0
          @intercept = ys.empty? ? 0.0 : median(ys.map(&:to_f))
          @noise = 0.0
          return freeze
        end
        slopes.sort!
        @slope = median_sorted(slopes)
        @intercept = median(xs.each_index.map { |i| ys[i] - @slope * xs[i] })
        @low, @high = sen_interval(slopes)
        # Robust scatter around the line: 1.4826 * MAD estimates sigma for
        # Gaussian noise without letting the occasional jump inflate it.
        @noise = 1.4826 * median(xs.each_index.map { |i| (ys[i] - predict(xs[i])).abs })
        freeze
      end

      def predict(x) = @intercept + @slope * x

      def to_h
        { slope: @slope.round(3), low: @low.round(3), high: @high.round(3), intercept: @intercept.round,
          noise: @noise.round, samples: @n }
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
        lower = ((count - c) / 2.0).floor.clamp(0, count - 1)
        upper = ((count + c) / 2.0).ceil.clamp(0, count - 1)
        [sorted[lower], sorted[upper]]
      end

      def median(values) = values.empty? ? 0.0 : median_sorted(values.sort)

      def median_sorted(sorted)
        mid = sorted.size / 2
        sorted.size.odd? ? sorted[mid].to_f : (sorted[mid - 1] + sorted[mid]) / 2.0
      end
    end
  end
end
