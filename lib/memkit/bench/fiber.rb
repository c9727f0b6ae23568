# frozen_string_literal: true

require "json"
require "optparse"
require_relative "../../memkit"
require_relative "../fiber_pool"

module Memkit
  module Bench
    # memkit bench fiber: what fibers cost on this Ruby build.
    #
    # The four shapes of CRuby's own benchmarks for its fiber pool (seed 004):
    #   allocate: create a fiber, resume it once (it suspends), drop it
    #   count:    keep N fibers alive and suspended (rate, RSS and address space per fiber)
    #   reuse:    batches of 1024 fibers created, suspended, then finished
    #   switch:   resume/yield ping-pong with one fiber
    # and the job shapes FiberPool exists for, run one after another inside
    # every round so that load from other processes hits them alike:
    #   new:   Fiber.new { job }.resume for every job
    #   pool:  Memkit::FiberPool#run { job } (errors, fiber-locals, storage handled)
    #   bare:  one fiber resumed again and again with no hygiene at all (the ceiling)
    # Every figure is the median of the rounds.
    class Fiber
      JOB_SHAPES = %w[new pool bare].freeze
      VM_SHAPES = %w[allocate reuse switch].freeze

      def self.run(argv, out: $stdout)
        new(argv, out).run
      end

      def initialize(argv, out)
        @out = out
        @rounds = 7
        @jobs = 200_000
        @fibers = 10_000
        @json = false
        parser = OptionParser.new do |o|
          o.banner = "Usage: memkit bench fiber [--rounds N] [--jobs N] [--fibers N] [--json]"
          o.on("--rounds N", Integer, "interleaved rounds, the median is reported (default #{@rounds})") { |n| @rounds = n }
          o.on("--jobs N", Integer, "jobs (or switches, or fibers) per shape per round (default #{@jobs})") { |n| @jobs = n }
          o.on("--fibers N", Integer, "live fibers for the count shape (default #{@fibers})") { |n| @fibers = n }
          o.on("--json", "print JSON") { @json = true }
        end
        parser.parse!(argv)
        raise CLI::UsageError, "unexpected argument #{argv.first.inspect}" unless argv.empty?
        raise CLI::UsageError, "--rounds, --jobs and --fibers must be positive" unless [@rounds, @jobs, @fibers].all?(&:positive?)
      end

      def run
        # First, while this process has made no fibers: the VM keeps finished
        # fibers' stacks, so a child forked later would reuse them for free.
        count = count_in_child(@fibers)
        rates = Hash.new { |h, k| h[k] = [] }
        pool = FiberPool.new
        @rounds.times do
          JOB_SHAPES.each { |shape| rates[shape] << rate(@jobs) { job_loop(shape, pool, @jobs) } }
          VM_SHAPES.each { |shape| rates[shape] << rate(@jobs) { vm_loop(shape, @jobs) } }
        end
        medians = rates.transform_values { |v| median(v) }
        report = {
          ruby: RUBY_DESCRIPTION, rounds: @rounds, jobs: @jobs, pool_core: FiberPool::NATIVE ? "c" : "ruby",
          per_second: medians.transform_values(&:round),
          ratios: { pool_vs_new: ratio(medians["pool"], medians["new"]),
                    bare_vs_new: ratio(medians["bare"], medians["new"]),
                    pool_vs_bare: ratio(medians["pool"], medians["bare"]) },
          count: count
        }
        @json ? @out.puts(JSON.pretty_generate(report)) : print_report(report)
        0
      end

      private

      def job_loop(shape, pool, n)
        i = 0
        case shape
        when "new"
          while i < n
            ::Fiber.new { i + 1 }.resume
            i += 1
          end
        when "pool"
          while i < n
            pool.run { i + 1 }
            i += 1
          end
        when "bare"
          fiber = ::Fiber.new { |job| job = ::Fiber.yield(job.call) while true } # rubocop:disable Style/InfiniteLoop
          while i < n
            fiber.resume(proc { i + 1 })
            i += 1
          end
        end
      end

      def vm_loop(shape, n)
        case shape
        when "allocate"
          n.times { ::Fiber.new { ::Fiber.yield }.resume }
        when "reuse"
          (n / 1024).clamp(1, nil).times do
            batch = Array.new(1024) { ::Fiber.new { ::Fiber.yield }.tap(&:resume) }
            batch.each(&:resume)
          end
        when "switch"
          fiber = ::Fiber.new { ::Fiber.yield while true } # rubocop:disable Style/InfiniteLoop
          n.times { fiber.resume }
        end
      end

      # In a child, so the fibers' memory does not stay in this process (on
      # builds whose fiber pool keeps finished stacks, it would never go away).
      def count_in_child(n)
        reader, writer = IO.pipe
        pid = fork do
          reader.close
          GC.start
          before_rss = Memkit.rss
          before = Memkit::Statm.read(Process.pid)
          maps_before = File.foreach("/proc/self/maps").count
          start = clock
          fibers = Array.new(n) { ::Fiber.new { ::Fiber.yield }.tap(&:resume) }
          elapsed = clock - start
          after_rss = Memkit.rss
          after = Memkit::Statm.read(Process.pid)
          maps = File.foreach("/proc/self/maps").count - maps_before
          stacks = Memkit.mappings.groups[:stacks]
          writer.write(JSON.generate(
                         fibers: fibers.size, per_second: (n / elapsed).round,
                         rss_per_fiber: (after_rss - before_rss) / n,
                         address_space_per_fiber: (after.size - before.size) / n,
                         mappings_per_fiber: (maps.to_f / n).round(2),
                         stack_mappings_rss: stacks.rss
                       ))
          writer.close
          exit!(0)
        end
        writer.close
        JSON.parse(reader.read, symbolize_names: true)
      ensure
        reader&.close
        Process.wait(pid) if pid
      end

      def print_report(r)
        rows = r[:per_second].map { |shape, per_s| [shape, per_s.to_s, unit(shape)] }
        @out.puts "#{r[:ruby]}"
        @out.puts "FiberPool core: #{r[:pool_core] == "c" ? "C (ext/memkit)" : "Ruby (ext/memkit is not built)"}"
        @out.puts "medians of #{r[:rounds]} interleaved rounds, #{r[:jobs]} jobs (or fibers, or switches) each"
        @out.puts CLI.table(%w[shape per_second unit], rows, left: [0, 2])
        @out.puts format("pool/new %.2fx   bare/new %.2fx   pool/bare %.2fx",
                         r[:ratios][:pool_vs_new], r[:ratios][:bare_vs_new], r[:ratios][:pool_vs_bare])
        c = r[:count]
        @out.puts format("count: %d live fibers at %d/s: %s RSS and %s address space per fiber, %.2f mappings per fiber",
                         c[:fibers], c[:per_second], Units.human(c[:rss_per_fiber]),
                         Units.human(c[:address_space_per_fiber]), c[:mappings_per_fiber])
        limit = File.read("/proc/sys/vm/max_map_count").to_i
        return unless c[:mappings_per_fiber].positive?

        @out.puts format("vm.max_map_count %d allows about %d live fibers in one process",
                         limit, (limit / c[:mappings_per_fiber]).floor)
      end

      def unit(shape)
        case shape
        when *JOB_SHAPES then "jobs"
        when "switch" then "resume+yield"
        else "fibers"
        end
      end

      def rate(n)
        start = clock
        yield
        n / (clock - start)
      end

      def clock = Process.clock_gettime(Process::CLOCK_MONOTONIC)

      def median(values)
        sorted = values.sort
        mid = sorted.size / 2
        sorted.size.odd? ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2.0
      end

      def ratio(a, b) = b.zero? ? 0.0 : (a / b).round(2)
    end
  end
end
