# frozen_string_literal: true

module Memkit
  module Soak
    # Memory against requests as an SVG line chart (one curve per run, its
    # fitted line dashed, the warm-up shaded), and that chart in a
    # self-contained HTML page: inline CSS and SVG, no scripts, no fonts or
    # images from anywhere, so the file can be mailed or attached to a ticket.
    module Chart
      COLORS = %w[#d62728 #1f77b4 #2ca02c #9467bd #ff7f0e #8c564b #e377c2 #17becf].freeze
      WIDTH = 860
      HEIGHT = 440
      LEFT = 84
      RIGHT = 24
      TOP = 24
      BOTTOM = 56

      module_function

      def svg(results, title: "memory over requests")
        series = results.map { |r| r.samples.map { |s| [s.requests, s.rss] } }
        xs = series.flatten(1).map(&:first)
        ys = series.flatten(1).map(&:last)
        x_max = [xs.max.to_f, 1.0].max
        y_lo, y_hi = padded(ys.min.to_f, ys.max.to_f)
        px = ->(x) { (LEFT + (WIDTH - LEFT - RIGHT) * x / x_max).round(1) }
        py = ->(y) { (HEIGHT - BOTTOM - (HEIGHT - TOP - BOTTOM) * (y - y_lo) / (y_hi - y_lo)).round(1) }
        parts = []
        parts << %(<svg xmlns="http://www.w3.org/2000/svg" width="#{WIDTH}" height="#{HEIGHT}" ) +
                 %(viewBox="0 0 #{WIDTH} #{HEIGHT}" ) +
                 %(font-family="sans-serif" font-size="12" role="img" aria-label="#{esc(title)}">)
        parts << %(<rect width="#{WIDTH}" height="#{HEIGHT}" fill="#fff"/>)
        warm = results.map(&:warmup).max.to_i
        if warm.positive?
          parts << %(<rect class="warmup" x="#{px[0]}" y="#{TOP}" width="#{(px[warm] - px[0]).round(1)}" ) +
                   %(height="#{HEIGHT - TOP - BOTTOM}" fill="#f2f2f2"/>)
          parts << %(<text x="#{px[0] + 4}" y="#{TOP + 14}" fill="#888">warm-up</text>)
        end
        ticks(0, x_max).each do |t|
          parts << %(<line x1="#{px[t]}" y1="#{HEIGHT - BOTTOM}" x2="#{px[t]}" ) +
                   %(y2="#{HEIGHT - BOTTOM + 5}" stroke="#333"/>)
          parts << %(<text x="#{px[t]}" y="#{HEIGHT - BOTTOM + 19}" text-anchor="middle">#{count(t)}</text>)
        end
        byte_ticks(y_lo, y_hi).each do |t|
          parts << %(<line x1="#{LEFT}" y1="#{py[t]}" x2="#{WIDTH - RIGHT}" y2="#{py[t]}" stroke="#e5e5e5"/>)
          parts << %(<text x="#{LEFT - 8}" y="#{py[t] + 4}" text-anchor="end">#{esc(Units.human(t.round))}</text>)
        end
        parts << %(<path d="M#{LEFT} #{TOP}V#{HEIGHT - BOTTOM}H#{WIDTH - RIGHT}" fill="none" stroke="#333"/>)
        parts << %(<text x="#{(LEFT + WIDTH - RIGHT) / 2}" y="#{HEIGHT - 14}" text-anchor="middle">requests</text>)
        parts << %(<text transform="translate(16 #{(TOP + HEIGHT - BOTTOM) / 2}) rotate(-90)" ) +
                 %(text-anchor="middle">rss</text>)
        results.each_with_index do |r, i|
          color = COLORS[i % COLORS.size]
          points = series[i].map { |x, y| "#{px[x]} #{py[y]}" }
          parts << %(<path class="curve" data-label="#{esc(label(r, i))}" data-points="#{points.size}" ) +
                   %(d="M#{points.join('L')}" fill="none" stroke="#{color}" stroke-width="2.5" ) +
                   %(stroke-linejoin="round"/>)
          fit = r.verdicts["rss"]&.full
          next unless fit && r.samples.size > 1

          x0 = r.warmup
          x1 = r.samples.last.requests
          parts << %(<path class="fit" d="M#{px[x0]} #{py[fit.predict(x0)]}L#{px[x1]} #{py[fit.predict(x1)]}" ) +
                   %(fill="none" stroke="#{color}" stroke-width="1.2" stroke-dasharray="6 4" opacity="0.8"/>)
        end
        results.each_with_index do |r, i|
          y = TOP + 16 + 18 * i
          x = LEFT + 110
          parts << %(<rect x="#{x}" y="#{y - 9}" width="14" height="4" fill="#{COLORS[i % COLORS.size]}"/>)
          parts << %(<text x="#{x + 20}" y="#{y - 3}">#{esc(label(r, i))}: #{esc(r.verdict.verdict)}, ) +
                   %(#{esc(r.bytes_per_request.to_s)} B/request (#{esc(r.metric)})</text>)
        end
        parts << "</svg>"
        parts.join("\n")
      end

      def html(results, title: "memkit soak")
        rows = results.each_with_index.map do |r, i|
          ci = r.confidence ? "#{r.confidence[0]} .. #{r.confidence[1]}" : ""
          key = %(<span class="key" style="background:#{COLORS[i % COLORS.size]}"></span>#{esc(label(r, i))})
          verdict = %(<td class="v-#{esc(r.verdict.verdict)}">#{esc(r.verdict.verdict)}</td>)
          rest = cells(r.bytes_per_request, r.metric, ci, r.requests, Units.human(r.samples.last.rss), r.verdict.reason)
          "<tr><td>#{key}</td>#{verdict}#{rest}</tr>"
        end
        sites = results.flat_map do |r|
          Array(r.attribution).map { |s| "<tr>#{cells(s.site, s.class_name, s.count, Units.human(s.bytes))}</tr>" }
        end
        first = results.first
        site_table = if sites.empty?
                       ""
                     else
                       "<h2>Allocation sites still retaining objects</h2><table>" \
                         "<tr>#{cells(*%w[site class objects bytes], tag: 'th')}</tr>\n#{sites.join("\n")}\n</table>"
                     end
        headers = ["run", "verdict", "bytes/request", "of", "95% CI", "requests", "final rss", "reason"]
        <<~HTML
          <!DOCTYPE html>
          <html lang="en"><head><meta charset="utf-8"><title>#{esc(title)}</title>
          <style>
          body{font-family:sans-serif;margin:24px;color:#222;background:#fff}
          table{border-collapse:collapse;margin:12px 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}
          .key{display:inline-block;width:12px;height:12px;margin-right:6px;vertical-align:middle}
          .v-leak{color:#b00;font-weight:bold}.v-plateau{color:#070}.v-inconclusive{color:#a60}
          </style></head><body>
          <h1>#{esc(title)}</h1>
          <p>#{esc(first.target)}: rss sampled every #{first.sample_every} requests;
          the rss fit (dashed) starts after #{first.warmup} warm-up requests.
          bytes/request is from rss or, in-process, from live memory (Ruby heap slots plus malloc'd bytes after a
          full GC), whichever found the leak more precisely.</p>
          #{svg(results, title: title)}
          <table><tr>#{cells(*headers, tag: 'th')}</tr>
          #{rows.join("\n")}
          </table>
          #{site_table}
          </body></html>
        HTML
      end

      # Table cells, each escaped.
      def cells(*values, tag: "td") = values.map { |v| "<#{tag}>#{esc(v)}</#{tag}>" }.join

      def label(result, index) = result.label || (index.zero? ? "default" : "run #{index + 1}")

      def esc(text) = text.to_s.gsub("&", "&amp;").gsub("<", "&lt;").gsub(">", "&gt;").gsub('"', "&quot;")

      def count(n) = n >= 1000 ? "#{(n / 1000.0).round(n % 1000 == 0 ? 0 : 1)}k" : n.round.to_s

      # Some air above and below the data so a flat curve is not on the frame.
      def padded(lo, hi)
        span = hi - lo
        span = [hi.abs * 0.01, 1024 * 1024.0].max if span < 1
        [lo - span * 0.08, hi + span * 0.08]
      end

      # Byte axes tick at round numbers of MiB (or KiB for small spans), so the
      # labels read 280 MiB rather than 286.1 MiB.
      def byte_ticks(lo, hi)
        unit = hi - lo >= 1024 * 1024 ? 1024 * 1024 : 1024
        ticks(lo / unit, hi / unit).map { |t| t * unit }
      end

      # About five round tick values between lo and hi: steps of 1, 2 or 5 x 10^k.
      def ticks(lo, hi)
        raw = (hi - lo) / 5.0
        mag = 10**Math.log10(raw).floor
        step = [1, 2, 5, 10].map { |m| m * mag }.find { |s| s >= raw }
        first = (lo / step).ceil * step
        (0..6).map { |k| first + k * step }.select { |t| t <= hi }
      end
    end
  end
end
