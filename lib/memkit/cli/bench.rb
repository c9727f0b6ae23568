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
        return Fiber.new(@cli, "bench fiber").call(argv) if name == "fiber"

        require_relative "../bench/#{name}"
        Memkit::Bench.const_get(name.capitalize).run(argv, out: out)
      end

      # memkit bench fiber: options in, Memkit::Bench::Fiber's report out.
      class Fiber < Command
        def call(argv)
          opts = {}
          parse(argv, "[--rounds N] [--jobs N] [--fibers N] [--core c|ruby] [--json]") do |o|
            o.on("--rounds N", Integer, "interleaved rounds, the median is reported (default 7)") do |n|
              opts[:rounds] = n
            end
            o.on("--jobs N", Integer, "jobs (or switches, or fibers) per shape per round (default 200000)") do |n|
              opts[:jobs] = n
            end
            o.on("--fibers N", Integer, "live fibers for the count shape (default 10000)") { |n| opts[:fibers] = n }
            o.on("--core NAME", %w[c ruby],
                 "FiberPool core of the pool shape: c or ruby (default: as FiberPool.new)") do |c|
              opts[:core] = c
            end
            json_option(o)
          end
          raise UsageError, "unexpected argument #{argv.first.inspect}" unless argv.empty?

          %i[rounds jobs fibers].each do |key|
            raise UsageError, "--#{key} must be positive" if opts.key?(key) && !opts[key].positive?
          end
          require_relative "../bench/fiber"
          if opts[:core] == "c" && !Native::LOADED
            raise UsageError, "--core c: ext/memkit is not built for this Ruby, or MEMKIT_NATIVE=0 is set"
          end

          report = Memkit::Bench::Fiber.new(**opts).run
          options[:json] ? print_json(report) : print_report(report)
          0
        end

        private

        def print_report(r)
          rows = r[:per_second].map { |shape, per_s| [shape, per_s.to_s, unit(shape)] }
          out.puts r[:ruby]
          out.puts "FiberPool core: #{r[:pool_core] == 'c' ? 'C (ext/memkit)' : 'Ruby'}"
          out.puts "medians of #{r[:rounds]} interleaved rounds, #{r[:jobs]} jobs (or fibers, or switches) each"
          out.puts CLI.table(%w[shape per_second unit], rows, left: [0, 2])
          out.puts format("pool/new %.2fx   bare/new %.2fx   pool/bare %.2fx",
                          r[:ratios][:pool_vs_new], r[:ratios][:bare_vs_new], r[:ratios][:pool_vs_bare])
          c = r[:count]
          out.puts format("count: %d live fibers at %d/s: %s RSS and %s address space per fiber, " \
                          "%.2f mappings per fiber", c[:fibers], c[:per_second], human(c[:rss_per_fiber]),
                          human(c[:address_space_per_fiber]), c[:mappings_per_fiber])
          limit = File.read("/proc/sys/vm/max_map_count").to_i
          return unless c[:mappings_per_fiber].positive?

          out.puts format("vm.max_map_count %d allows about %d live fibers in one process",
                          limit, (limit / c[:mappings_per_fiber]).floor)
        end

        def unit(shape)
          case shape
          when "new", "pool", "bare" then "jobs"
          when "switch" then "resume+yield"
          else "fibers"
          end
        end
      end
    end
  end
end
