# frozen_string_literal: true

module Memkit
  module Soak
    # What a soak found: the samples, a fit per memory series, the verdict.
    # The verdict and bytes_per_request come from rss (what the kernel and
    # the OOM killer count); heap and malloc fits are there to tell a Ruby
    # object leak from a C-level one.
    class Result
      SERIES = %i[rss heap_live_bytes malloc_bytes].freeze

      attr_reader :target, :mode, :pid, :requests, :warmup, :sample_every, :samples, :seconds, :gc_seconds,
                  :min_leak, :malloc_source, :attribution, :http_errors, :verdict, :fits
      attr_accessor :label

      def initialize(target:, mode:, pid:, requests:, warmup:, sample_every:, samples:, seconds:, min_leak:,
                     gc_seconds: 0.0, malloc_source: nil, attribution: nil, http_errors: nil, label: nil)
        @target = target
        @mode = mode
        @pid = pid
        @requests = requests
        @warmup = warmup
        @sample_every = sample_every
        @samples = samples.map { |s| s.is_a?(Sample) ? s : Sample.new(**s.transform_keys(&:to_sym).slice(*Sample.members)) }
        @seconds = seconds
        @gc_seconds = gc_seconds
        @min_leak = min_leak
        @malloc_source = malloc_source
        @attribution = attribution
        @http_errors = http_errors
        @label = label
        window = @samples.select { |s| s.requests >= warmup }
        @verdict = Verdict.judge(window.map(&:requests), window.map(&:rss), min_leak: min_leak)
        @fits = SERIES.to_h { |key| [key, fit(window, key)] }.compact
      end

      def bytes_per_request = @verdict.full&.slope&.round(1)
      def confidence = @verdict.full && [@verdict.full.low.round(1), @verdict.full.high.round(1)]
      def requests_per_second = (@requests / @seconds).round

      def to_h
        {
          target: target, label: label, mode: mode, pid: pid, requests: requests, warmup: warmup,
          sample_every: sample_every, seconds: seconds.round(3), requests_per_second: requests_per_second,
          gc_seconds: gc_seconds.round(3), metric: "rss", bytes_per_request: bytes_per_request,
          confidence_interval: confidence, verdict: verdict.verdict, reason: verdict.reason, min_leak: min_leak,
          fits: fits.transform_values(&:to_h), last_half_bytes_per_request: verdict.tail&.slope&.round(1),
          malloc_source: malloc_source, http_errors: http_errors,
          attribution: attribution&.map(&:to_h), samples: samples.map(&:to_h)
        }.compact
      end

      # One row per sample; empty cells where the mode has no such figure.
      def to_csv
        cols = %i[requests seconds rss heap_live_slots heap_live_bytes malloc_bytes gc]
        [cols.join(","), *samples.map { |s| cols.map { |c| s[c] }.join(",") }].join("\n") + "\n"
      end

      def self.from_h(h)
        h = h.transform_keys(&:to_sym)
        new(**h.slice(:target, :mode, :pid, :requests, :warmup, :sample_every, :samples, :seconds, :min_leak,
                      :gc_seconds, :malloc_source, :http_errors, :label))
      end

      private

      def fit(window, key)
        points = window.reject { |s| s[key].nil? }
        # Heap figures between GCs include garbage; fit only the samples taken
        # right after a forced GC when there are enough of them.
        if key != :rss
          clean = points.select(&:gc)
          points = clean if clean.size >= Verdict::MIN_SAMPLES
        end
        return nil if points.size < 2

        Fit.of(points.map(&:requests), points.map { |s| s[key] })
      end
    end
  end
end
