# frozen_string_literal: true

require_relative "../memkit"

module Memkit
  # When to refork, decided from what the workers' memory shows rather than
  # from a request count.
  #
  # A forked worker starts out sharing nearly every page with its parent (the
  # Puma master or worker 0, Pitchfork's mold). Each first-use write after
  # fork -- a template compiled, a cache filled, an inline cache set, an
  # object aged by the GC -- copies a page into the worker, so its USS grows
  # and what it shares shrinks. Much of that growth is the same warm-up in
  # every worker; forking the workers again from a warm one (Puma's refork,
  # Pitchfork's promotion) makes it shared once more. A request count is a
  # proxy for that decay which fits one app and not the next; this policy
  # watches the decay itself.
  #
  # The policy is pure: readings in, a Decision out, with the clock passed
  # in. Thin adapters read /proc and trigger the server's own refork
  # (Memkit::Refork::Puma, Memkit::Refork::Pitchfork).
  module Refork
    # One worker as memkit saw it, bytes as Integers.
    #   uss_growth: its USS now minus its USS when first seen after fork
    #   shared:     Shared_Clean + Shared_Dirty (pages it shares with its parent and siblings)
    #   parent_rss: the RSS of the process it was forked from
    #   requests:   requests it served since fork, or nil when the server does not say
    Reading = Struct.new(:pid, :uss_growth, :shared, :parent_rss, :requests, keyword_init: true) do
      # Fraction of the parent's memory this worker still shares (0.0..1.0).
      def shared_ratio
        parent_rss.positive? ? [shared.fdiv(parent_rss), 1.0].min : 0.0
      end
    end

    # refork: true/false; reason: a Symbol (:growth, :sharing, :cooldown,
    # :confirming, :cold, :no_workers, :healthy, :max_reforks); the medians it
    # was decided on, and the growth threshold in bytes.
    Decision = Struct.new(:refork, :reason, :growth, :shared_ratio, :threshold, :workers, keyword_init: true) do
      alias_method :refork?, :refork

      def to_s
        format("%s (%s): median worker USS growth %.1f MiB of a %.1f MiB threshold, shares %.0f%% of its parent " \
               "(%d workers)", refork ? "refork" : "wait", reason, growth.to_i / 1_048_576.0,
               threshold.to_i / 1_048_576.0, 100.0 * shared_ratio.to_f, workers.to_i)
      end
    end

    # Decides "refork now" from a list of readings (one per worker, or just
    # the calling worker's own on Pitchfork).
    #
    # It reforks when the median worker has grown by `growth` of its parent's
    # RSS (at least `min_growth` bytes), or shares less than `min_shared` of
    # its parent, on `confirm` checks in a row. Workers that served fewer than
    # `min_requests` are too cold to judge and are left out. After a refork it
    # waits `cooldown` seconds, doubled (`backoff`) after each further refork
    # up to `max_cooldown`, so an app whose workers diverge for reasons a
    # refork cannot fix pays for fewer and fewer reforks rather than one a minute.
    class Policy
      DEFAULTS = { growth: 0.10, min_growth: 8 * 1_048_576, min_shared: 0.5, confirm: 2, min_requests: 100,
                   cooldown: 60.0, backoff: 2.0, max_cooldown: 3600.0, max_reforks: nil }.freeze

      attr_reader :reforks, :options

      # growth:       fraction of the parent's RSS a worker may add before a refork (0.10)
      # min_growth:   bytes of growth below which it never reforks (8 MiB)
      # min_shared:   fraction of the parent's RSS a worker should still share, or nil to ignore sharing (0.5)
      # confirm:      checks in a row the condition must hold (2)
      # min_requests: requests a worker must have served to count (100; readings without a count always count)
      # cooldown:     seconds after a refork before the next one (60.0)
      # backoff:      factor applied to the cooldown after each refork (2.0)
      # max_cooldown: the longest cooldown (3600.0)
      # max_reforks:  stop after this many reforks, or nil for no limit
      def initialize(**options)
        unknown = options.keys - DEFAULTS.keys
        raise InvalidArgument, "unknown option #{unknown.first}: (known: #{DEFAULTS.keys.join(', ')})" if unknown.any?

        @options = DEFAULTS.merge(options).freeze
        validate!
        @streak = 0
        @reforks = 0
        @quiet_until = nil
      end

      # readings: Array of Reading; now: seconds on a monotonic clock.
      def check(readings, now:)
        warm = readings.select { |r| r.requests.nil? || r.requests >= @options[:min_requests] }
        return decide(false, :no_workers) if readings.empty?
        return decide(false, :cold, workers: 0) if warm.empty?

        growth = median(warm.map(&:uss_growth))
        ratio = median(warm.map(&:shared_ratio))
        threshold = [@options[:min_growth], (@options[:growth] * median(warm.map(&:parent_rss))).round].max
        cause =
          if growth >= threshold then :growth
          elsif @options[:min_shared] && ratio < @options[:min_shared] && growth >= @options[:min_growth] then :sharing
          end
        @streak = cause ? @streak + 1 : 0
        stats = { growth: growth, shared_ratio: ratio, threshold: threshold, workers: warm.size }
        return decide(false, :healthy, **stats) unless cause
        return decide(false, :max_reforks, **stats) if @options[:max_reforks] && @reforks >= @options[:max_reforks]
        return decide(false, :cooldown, **stats) if @quiet_until && now < @quiet_until
        return decide(false, :confirming, **stats) if @streak < @options[:confirm]

        decide(true, cause, **stats)
      end

      # The adapter calls this once it has asked the server to refork.
      def reforked!(now:)
        @reforks += 1
        @streak = 0
        wait = @options[:cooldown] * (@options[:backoff]**(@reforks - 1))
        @quiet_until = now + [wait, @options[:max_cooldown]].min
      end

      # Seconds on the clock before which no refork is decided, or nil.
      attr_reader :quiet_until

      private

      def decide(refork, reason, growth: 0, shared_ratio: 0.0, threshold: 0, workers: 0)
        Decision.new(refork: refork, reason: reason, growth: growth, shared_ratio: shared_ratio,
                     threshold: threshold, workers: workers).freeze
      end

      # The middle worker: one worker that served an odd request does not
      # trigger a refork, and one that stayed cold does not hold it back.
      def median(values)
        sorted = values.sort
        mid = sorted.size / 2
        sorted.size.odd? ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2r
      end

      def validate!
        o = @options
        fraction = ->(v) { v.is_a?(Numeric) && v.positive? && v <= 1 }
        require_option(:growth, "a fraction in (0, 1]") { fraction.(o[:growth]) }
        require_option(:min_shared, "nil or a fraction in (0, 1]") { o[:min_shared].nil? || fraction.(o[:min_shared]) }
        require_option(:min_growth, "an Integer >= 0") { o[:min_growth].is_a?(Integer) && o[:min_growth] >= 0 }
        require_option(:min_requests, "an Integer >= 0") { o[:min_requests].is_a?(Integer) && o[:min_requests] >= 0 }
        require_option(:confirm, "an Integer >= 1") { o[:confirm].is_a?(Integer) && o[:confirm] >= 1 }
        %i[cooldown max_cooldown].each do |key|
          require_option(key, "a number of seconds >= 0") { o[key].is_a?(Numeric) && o[key] >= 0 }
        end
        require_option(:backoff, "a number >= 1") { o[:backoff].is_a?(Numeric) && o[:backoff] >= 1 }
        require_option(:max_reforks, "nil or an Integer >= 0") do
          o[:max_reforks].nil? || (o[:max_reforks].is_a?(Integer) && o[:max_reforks] >= 0)
        end
      end

      def require_option(key, expected)
        raise InvalidArgument, "#{key}: must be #{expected}, not #{@options[key].inspect}" unless yield
      end
    end
  end
end
