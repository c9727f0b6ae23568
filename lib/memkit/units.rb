# frozen_string_literal: true

module Memkit
  # Byte counts for people: "12.3 MiB" out, "300MB" / "1.5G" in.
  module Units
    SUFFIXES = %w[B KiB MiB GiB TiB].freeze
    MULTIPLIERS = { "" => 1, "k" => 1024, "m" => 1024**2, "g" => 1024**3, "t" => 1024**4 }.freeze

    module_function

    def human(bytes)
      return "#{bytes} B" if bytes.abs < 1024

      exp = [(Math.log(bytes.abs) / Math.log(1024)).floor, SUFFIXES.size - 1].min
      format("%.1f %s", bytes.to_f / (1024**exp), SUFFIXES[exp])
    end

    # Sizes use powers of 1024 whether written "MB" or "MiB", as ps, top and
    # Unicorn/Puma configs do.
    def parse(value, name = "size")
      return value if value.is_a?(Integer) && value >= 0

      m = /\A\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*\z/i.match(value.to_s)
      raise InvalidArgument, "#{name}: not a size: #{value.inspect} (try 300MB or 1.5GB)" unless m

      (m[1].to_f * MULTIPLIERS.fetch(m[2].downcase)).round
    end
  end
end
