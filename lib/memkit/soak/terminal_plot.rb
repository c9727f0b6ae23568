# frozen_string_literal: true

module Memkit
  module Soak
    # rss against requests in plain characters, one mark per run, so the
    # shape is visible in a terminal or a CI log without opening a file.
    module TerminalPlot
      MARKS = %w[* o + x # @ % &].freeze

      module_function

      def render(results, width: 64, height: 14)
        points = results.map { |r| r.samples.map { |s| [s.requests, s.rss] } }
        all = points.flatten(1)
        return "" if all.empty?

        x_max = [all.map(&:first).max, 1].max.to_f
        lo, hi = all.map(&:last).minmax
        hi = lo + 1 if hi == lo
        grid = Array.new(height) { Array.new(width, " ") }
        points.each_with_index do |pts, i|
          pts.each do |x, y|
            col = ((width - 1) * x / x_max).round
            row = (height - 1) - ((height - 1) * (y - lo) / (hi - lo).to_f).round
            grid[row][col] = MARKS[i % MARKS.size]
          end
        end
        labels = [Units.human(hi), Units.human((lo + hi) / 2), Units.human(lo)]
        pad = labels.map(&:size).max
        lines = grid.each_with_index.map do |row, r|
          label = { 0 => labels[0], (height - 1) / 2 => labels[1], height - 1 => labels[2] }[r] || ""
          "#{label.rjust(pad)} |#{row.join}"
        end
        lines << "#{' ' * pad} +#{'-' * width}"
        lines << "#{' ' * pad}  0#{"#{x_max.round} requests".rjust(width - 1)}"
        if results.size > 1
          lines << results.each_with_index.map { |r, i| "#{MARKS[i % MARKS.size]} #{Chart.label(r, i)}" }.join("   ")
        end
        lines.join("\n")
      end
    end
  end
end
