# frozen_string_literal: true

require "json"
require_relative "../../memkit"
require_relative "../fiber_pool"

module Memkit
  module Bench
    # memkit bench fiber: what fibers cost on this Ruby build.
    #
    # The four shapes of CRuby's own benchmarks for its fiber pool
    # (benchmark/vm2_fiber_*.yml in ruby/ruby):
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

      CORES = { "c" => -> { FiberPool::NativeCore if Native::LOADED }, "ruby" => -> { FiberPool::RubyCore } }.freeze

      # rounds: interleaved rounds (the median is reported); jobs: jobs (or
      # switches, or fibers) per shape per round; fibers: live fibers for the
      # count shape; core: "c" or "ruby", the FiberPool core the pool shape
      # uses (default: the one FiberPool.new picks).
      def initialize(rounds: 7, jobs: 200_000, fibers: 10_000, core: nil)
        { rounds: rounds, jobs: jobs, fibers: fibers }.each do |name, value|
          next if value.is_a?(Integer) && value.positive?

          raise InvalidArgument, "Bench::Fiber #{name}: expected a positive Integer, got #{value.inspect}"
        end
        @rounds = rounds
        @jobs = jobs
        @fibers = fibers
        @core = core.nil? ? FiberPool::CORE : core_class(core)
      end

      # The report as a Hash (rates per second, ratios, the count shape).
      def run
        # First, while this process has made no fibers: the VM keeps finished
        # fibers' stacks, so a child forked later would reuse them for free.
        count = count_in_child(@fibers)
        rates = Hash.new { |h, k| h[k] = [] }
        pool = @core.new
        @rounds.times do
          JOB_SHAPES.each { |shape| rates[shape] << rate(@jobs) { job_loop(shape, pool, @jobs) } }
          VM_SHAPES.each { |shape| rates[shape] << rate(@jobs) { vm_loop(shape, @jobs) } }
        end
        medians = rates.transform_values { |v| median(v) }
        report = {
          ruby: RUBY_DESCRIPTION, rounds: @rounds, jobs: @jobs, pool_core: @core == FiberPool::RubyCore ? "ruby" : "c",
          per_second: medians.transform_values(&:round),
          ratios: { pool_vs_new: ratio(medians["pool"], medians["new"]),
                    bare_vs_new: ratio(medians["bare"], medians["new"]),
                    pool_vs_bare: ratio(medians["pool"], medians["bare"]) },
          count: count
        }
        report
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
          fiber = ::Fiber.new { |job| job = ::Fiber.yield(job.call) while true }
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
          fiber = ::Fiber.new { ::Fiber.yield while true }
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

      def core_class(name)
        unless CORES.key?(name)
          raise InvalidArgument, "Bench::Fiber core: expected one of #{CORES.keys.join(', ')}, got #{name.inspect}"
        end

        CORES.fetch(name).call or
          raise InvalidArgument, "Bench::Fiber core: \"c\", but ext/memkit is not built or MEMKIT_NATIVE=0 is set"
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
