# frozen_string_literal: true

module Memkit
  class Metrics
    # Prometheus text format 0.0.4, built family by family. Label values are
    # escaped as the format requires (backslash, double quote, newline); any
    # other byte, control characters included, is legal inside the quotes,
    # and bytes that are not UTF-8 are replaced so the page stays UTF-8.
    class Exposition
      CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

      def initialize
        @out = +""
      end

      # rows: [[{label => value}, number], ...]; a family with no rows is
      # left out, so that its HELP and TYPE never stand alone.
      def gauge(name, help, rows) = family(name, "gauge", help, rows)
      def counter(name, help, rows) = family(name, "counter", help, rows)

      def comment(text)
        @out << "# " << text.to_s.gsub(/[\r\n]+/, " ") << "\n"
        self
      end

      def to_s = @out.dup

      def self.escape(value)
        value.to_s.dup.force_encoding(Encoding::UTF_8).scrub("?")
             .gsub("\\") { "\\\\" }.gsub("\"") { "\\\"" }.gsub("\n") { "\\n" }
      end

      def self.number(value)
        case value
        when Float
          if value.nan? then "NaN"
          elsif value.infinite? then value.positive? ? "+Inf" : "-Inf"
          else value.to_s
          end
        else Integer(value).to_s
        end
      end

      private

      def family(name, type, help, rows)
        return self if rows.empty?

        @out << "# HELP " << name << " " << help.gsub("\\") { "\\\\" }.gsub("\n") { "\\n" } << "\n"
        @out << "# TYPE " << name << " " << type << "\n"
        rows.each do |labels, value|
          @out << name
          unless labels.empty?
            @out << "{" << labels.map { |k, v| "#{k}=\"#{Exposition.escape(v)}\"" }.join(",") << "}"
          end
          @out << " " << Exposition.number(value) << "\n"
        end
        self
      end
    end
  end
end
