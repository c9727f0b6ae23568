# frozen_string_literal: true

module Memkit
  module Soak
    # leak, plateau or inconclusive, with the reason in one sentence.
    #
    # A leak must show on four counts at once: the window after warm-up spans
    # at least MIN_SPAN requests in MIN_SAMPLES samples (over a shorter one, a
    # cache that is still filling grows as straight a line as a leak does:
    # nothing in the curve tells them apart); the whole window's slope is
    # above min_leak even at the low end of its interval, which Fit widens
    # for samples that depend on each other; the last half of the window
    # still grows (a cache that is still filling slows down; a leak does
    # not); and the growth over the window is several times the scatter
    # around the line. A plateau needs the last half's whole interval below
    # min_leak, over a last half long enough to have seen min_leak
    # (MIN_FLAT_GROWTH). Anything else is inconclusive, and the reason says
    # what to change.
    Verdict = Struct.new(:verdict, :reason, :full, :tail, keyword_init: true) do
      # min_span: requests after warm-up below which growth is not called a
      # leak (MIN_SPAN in process, URL_MIN_SPAN for a server's rss).
      def self.judge(xs, ys, min_leak:, min_span: Verdict::MIN_SPAN)
        if xs.size < Verdict::MIN_SAMPLES
          return new(verdict: "inconclusive",
                     reason: "only #{xs.size} samples after warm-up (need #{Verdict::MIN_SAMPLES}): " \
                             "run more requests or sample more often")
        end

        full = Fit.of(xs, ys)
        half = xs.size / 2
        tail = Fit.of(xs.drop(half), ys.drop(half))
        span = xs.last - xs.first
        growth = full.slope * span
        noisy = growth < Verdict::NOISE_FACTOR * full.noise
        short = span < min_span
        b = ->(v) { "#{v.round} B/request" }
        ci = ->(f) { "95% CI #{f.low.round}..#{f.high.round}" }
        limit = "under the #{min_leak.round} B/request leak threshold"
        verdict, reason =
          if full.low > min_leak && tail.low > min_leak && !noisy && short
            ["inconclusive", "grows #{b[full.slope]} (#{ci[full]}) over #{span} requests after warm-up, too few to " \
                             "tell a leak from a cache still filling (a leak verdict needs #{min_span}): " \
                             "run more requests"]
          elsif full.low > min_leak && tail.low > min_leak && !noisy
            ["leak", "grows #{b[full.slope]} (#{ci[full]}), +#{Units.human(growth.round)} over #{span} requests, " \
                     "and still #{b[tail.slope]} in the last half"]
          elsif tail.high < min_leak && full.low > min_leak
            ["plateau", "grew #{b[full.slope]} early on but the last #{xs.last - xs[half]} requests are flat " \
                        "(#{b[tail.slope]}, #{ci[tail]}, #{limit})"]
          elsif tail.high < min_leak
            ["plateau", "flat: the last #{xs.last - xs[half]} requests grow #{b[tail.slope]} (#{ci[tail]}), " \
                        "#{limit}; the whole window #{b[full.slope]}"]
          elsif full.high < min_leak && tail.low <= min_leak
            ["plateau", "flat: #{b[full.slope]} (#{ci[full]}) is #{limit}"]
          elsif full.low > min_leak && tail.low <= min_leak
            ["inconclusive", "grows #{b[full.slope]} overall but the last half is not clearly growing " \
                             "(#{b[tail.slope]}, #{ci[tail]}): " \
                             "a cache still filling or a slow leak; run more requests"]
          elsif noisy && full.low > min_leak
            ["inconclusive", "growth of #{Units.human(growth.round)} is within #{Verdict::NOISE_FACTOR}x the noise " \
                             "(#{Units.human(full.noise.round)}): run more requests"]
          else
            ["inconclusive", "#{b[full.slope]} (#{ci[full]}) straddles the #{min_leak.round} B/request leak " \
                             "threshold: noise #{Units.human(full.noise.round)}; run more requests"]
          end
        tail_span = xs.last - xs[half]
        if verdict == "plateau" && min_leak * tail_span < Verdict::MIN_FLAT_GROWTH
          verdict = "inconclusive"
          reason = "flat so far, but over the last #{tail_span} requests a #{min_leak.round} B/request leak would " \
                   "add only #{Units.human((min_leak * tail_span).round)}, too little to see: run more requests"
        end
        new(verdict: verdict, reason: reason, full: full, tail: tail)
      end
    end

    class Verdict
      MIN_SAMPLES = 8
      # Requests after warm-up below which growth is never called a leak. A
      # cache of N entries grows in a straight line for its first N misses;
      # 4,000 covers the caches of a typical app's first minutes (templates,
      # routes, i18n, statement caches), and the default 20,000-request soak
      # has 16,000 after warm-up.
      MIN_SPAN = 4_000
      # The same for a server soaked through its URL, whose rss is all there
      # is: no forced GC, so it also grows by garbage until Ruby's malloc and
      # oldmalloc limits (up to 32 + 128 MiB a worker by default) stop it.
      # On Unicorn with 2 workers, a bounded cache and a Rails-like page both
      # grew 100..900 B/request in a straight line at 6,000 and 20,000
      # requests (docs/BENCHMARKS.md). 50,000 is a floor, not a guarantee:
      # the in-process soak of the same config.ru is the precise one.
      URL_MIN_SPAN = 50_000
      NOISE_FACTOR = 3
      # A plateau is a claim that growth is under min_leak; it needs a last
      # half long enough for min_leak to have added 8 pages (32 KiB), so that
      # page-granular rss could have shown a leak at the threshold. Over 10
      # requests a 400 B/request leak adds one page, and rss looks flat.
      MIN_FLAT_GROWTH = 32 * 1024
    end
  end
end
