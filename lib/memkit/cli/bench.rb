# frozen_string_literal: true

module Memkit
  class CLI
    # memkit bench NAME: benchmarks run by hand; each lives in lib/memkit/bench/NAME.rb
    # and defines Memkit::Bench::NAME.run(argv, out:) returning an exit status.
    class Bench < Command
      NAMES = { "cow" => "copy-on-write after fork: plain, nakayoshi_fork, Puma's recipe, memkit",
                "fiber" => "fiber allocation, reuse and switch; FiberPool vs a new fiber per job" }.freeze

      def call(argv)
        name = argv.shift
        if name.nil? || %w[-h --help].include?(name)
          out.puts "Usage: memkit bench NAME [options]", *NAMES.map { |n, what| format("  %-6s %s", n, what) }
          return name ? 0 : 2
        end
        raise UsageError, "unknown benchmark #{name.inspect} (#{NAMES.keys.join(', ')})" unless NAMES.key?(name)

        require_relative "../bench/#{name}"
        Memkit::Bench.const_get(name.capitalize).run(argv, out: out)
      end
    end
  end
end
