# frozen_string_literal: true

module Memkit
  module Soak
    # What a soak found: the samples, a fit per memory series, the verdict.
    #
    # Two curves are judged. rss is what the kernel and the OOM killer count,
    # but a Ruby process's rss moves in bursts (the heap grows by a factor,
    # malloc reuses freed pages), so a leak of Ruby objects can look flat for
    # thousands of requests. In-process there is also "live": Ruby heap slots
    # in use plus malloc'd bytes, read right after a full GC, which rises by
    # exactly what is retained but cannot see fragmentation or a buffer's
    # unused capacity. A leak on live is a leak. A leak on rss alone is one
    # too, unless live memory did not grow over the whole window: then the
    # process kept nothing it allocated and rss grew by heap pages or
    # allocator arenas, which level off; that is inconclusive until a longer
    # run shows rss flatten.
    # A plateau needs both curves flat.
    #
    # The soak's own bookkeeping is kept out of the curves (SampleLog), and
    # what is left of it is measured: baseline holds samples taken with the
    # app not called, and their growth per sample is taken out of the live
    # curve before it is judged.
    class Result
      SERIES = %i[rss heap_live_bytes malloc_bytes].freeze

      attr_reader :target, :mode, :pid, :requests, :warmup, :sample_every, :samples, :seconds, :gc_seconds,
                  :min_leak, :malloc_source, :attribution, :http_errors, :verdict, :fits, :metric, :verdicts,
                  :baseline
      attr_accessor :label

      def initialize(target:, mode:, pid:, requests:, warmup:, sample_every:, samples:, seconds:, min_leak:,
                     gc_seconds: 0.0, malloc_source: nil, attribution: nil, http_errors: nil, label: nil,
                     baseline: nil)
        @target = target
        @mode = mode
        @pid = pid
        @requests = requests
        @warmup = warmup
        @sample_every = sample_every
        @samples = samples.map { |s| self.class.sample(s) }
        @seconds = seconds
        @gc_seconds = gc_seconds
        @min_leak = min_leak
        @malloc_source = malloc_source
        @attribution = attribution
        @http_errors = http_errors
        @label = label
        @baseline = baseline&.map { |s| self.class.sample(s) }
        window = @samples.select { |s| s.requests >= warmup }
        @fits = SERIES.to_h { |key| [key, fit(window, key)] }.compact
        min_span = mode.to_s == "url" ? Verdict::URL_MIN_SPAN : Verdict::MIN_SPAN
        @verdicts = { "rss" => Verdict.judge(window.map(&:requests), window.map(&:rss), min_leak: min_leak,
                                             min_span: min_span) }
        live = window.select { |s| s.gc && s.heap_live_bytes && s.malloc_bytes }
        if live.size >= Verdict::MIN_SAMPLES
          index = @samples.each_with_index.to_h { |s, i| [s.requests, i] }
          @verdicts["live"] = Verdict.judge(live.map(&:requests), live.map do |s|
            s.heap_live_bytes + s.malloc_bytes - (sampler_bytes_per_sample * index.fetch(s.requests)).round
          end, min_leak: min_leak)
        end
        @metric, @verdict = combine(@verdicts)
      end

      # Live bytes the sampler itself adds per sample, measured with the app
      # not called: the Theil-Sen slope over the baseline's second half (its
      # first samples warm the sampler's own code up), 0 without a baseline.
      def sampler_bytes_per_sample
        @sampler_bytes_per_sample ||= begin
          steady = Array(@baseline).select { |s| s.heap_live_bytes && s.malloc_bytes }
          steady = steady.drop(steady.size / 2)
          if steady.size < 3
            0.0
          else
            Fit.of(steady.each_index.to_a, steady.map { |s| s.heap_live_bytes + s.malloc_bytes }).slope
          end
        end
      end

      def bytes_per_request = @verdict.full && (@verdict.full.slope.round(1) + 0.0)
      # + 0.0 turns a rounded -0.0 into 0.0.
      def confidence = @verdict.full && [@verdict.full.low.round(1) + 0.0, @verdict.full.high.round(1) + 0.0]
      def requests_per_second = (@requests / @seconds).round

      def to_h
        {
          target: target, label: label, mode: mode, pid: pid, requests: requests, warmup: warmup,
          sample_every: sample_every, seconds: seconds.round(3), requests_per_second: requests_per_second,
          gc_seconds: gc_seconds.round(3), metric: metric, bytes_per_request: bytes_per_request,
          confidence_interval: confidence, verdict: verdict.verdict, reason: verdict.reason, min_leak: min_leak,
          last_half_bytes_per_request: verdict.tail&.slope&.round(1),
          verdicts: verdicts.transform_values do |v|
            { verdict: v.verdict, reason: v.reason, fit: v.full&.to_h }.compact
          end,
          fits: fits.transform_values(&:to_h), sampler_bytes_per_sample: @baseline && sampler_bytes_per_sample.round(1),
          malloc_source: malloc_source, http_errors: http_errors,
          attribution: attribution&.map(&:to_h), samples: samples.map(&:to_h), baseline: baseline&.map(&:to_h)
        }.compact
      end

      # One row per sample; empty cells where the mode has no such figure.
      def to_csv
        cols = %i[requests seconds rss heap_live_slots heap_live_bytes malloc_bytes gc]
        [cols.join(","), *samples.map { |s| cols.map { |c| s[c] }.join(",") }].join("\n") + "\n"
      end

      # A Sample, from a Sample or its Hash (read back from JSON).
      def self.sample(s) = s.is_a?(Sample) ? s : Sample.new(**s.transform_keys(&:to_sym).slice(*Sample.members))

      def self.from_h(h)
        h = h.transform_keys(&:to_sym)
        sites = h[:attribution]&.map { |s| Attribution::Site.new(**s.transform_keys(&:to_sym)) }
        new(**h.slice(:target, :mode, :pid, :requests, :warmup, :sample_every, :samples, :seconds, :min_leak,
                      :gc_seconds, :malloc_source, :http_errors, :label, :baseline), attribution: sites)
      end

      private

      # The curve that decides: a leak on either (the tighter interval
      # relative to its slope if both), else a plateau only if every judged
      # curve is flat, else the inconclusive one's reason.
      def combine(verdicts)
        leaks = verdicts.select { |_, v| v.verdict == "leak" }
        live = verdicts["live"]
        if leaks.keys == ["rss"] && live&.verdict == "plateau" && live.full.high < min_leak
          rss = verdicts["rss"]
          return ["rss", Verdict.new(verdict: "inconclusive", full: rss.full, tail: rss.tail,
                                     reason: "rss #{rss.reason}, but live memory is flat (#{live.reason}): " \
                                             "heap pages or malloc arenas growing, which level off; run more requests")]
        end
        return leaks.min_by { |_, v| (v.full.high - v.full.low) / v.full.slope } if leaks.any?
        return ["rss", verdicts["rss"]] if verdicts.values.all? { |v| v.verdict == "plateau" }

        verdicts.find { |_, v| v.verdict == "inconclusive" }
      end

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
