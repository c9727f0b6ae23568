# frozen_string_literal: true

require "memkit"
require_relative "memory_limit"
require_relative "oob_gc"

module Memkit
  # Sidekiq: garbage collection between jobs and a memory limit applied
  # between jobs, as a Sidekiq server middleware (Sidekiq's own API for
  # wrapping every job a process runs).
  #
  #   require "memkit/sidekiq"
  #   Sidekiq.configure_server do |config|
  #     config.server_middleware do |chain|
  #       chain.add Memkit::Sidekiq::Middleware, max_uss: "500MB"
  #     end
  #   end
  #
  # Each job runs inside Memkit::OobGC and Memkit::MemoryLimit, called as
  # Rack apps: the job is the request, and the moment after it is the moment
  # after the response, where OobGC runs a GC the next job would otherwise
  # pay for and MemoryLimit reads the process's memory. OobGC only collects
  # when no other job is in flight in the process, so with concurrency above 1
  # it finds fewer such moments on a busy queue.
  #
  # Over the limit, the process is replaced the way Sidekiq stops gracefully:
  # TSTP (quiet: fetch no new job; a job fetched after that is put back),
  # then, once the jobs in flight have finished, TERM, after which Sidekiq
  # exits and whatever supervises it (systemd, Kubernetes, foreman) starts a
  # fresh process. A job still running when Sidekiq's own shutdown timeout
  # (-t) runs out is pushed back to Redis by Sidekiq. One log line says why.
  module Sidekiq
    class Middleware
      @runners = {}
      @runners_lock = Mutex.new

      class << self
        # Sidekiq builds a new middleware object for every job, so what must
        # last (the counters, the limits, whether the process is stopping)
        # lives in one Runner per set of options.
        def runner(options)
          @runners_lock.synchronize { @runners[options] ||= Runner.new(**options) }
        end
      end

      # Sidekiq 7 builds middleware with `new(*args)`, so `chain.add(Middleware,
      # max_uss: "500MB")` arrives as one Hash: both forms are taken.
      def initialize(options = {}, **keywords)
        @runner = self.class.runner(options.transform_keys(&:to_sym).merge(keywords).freeze)
      end

      # Sidekiq's server middleware interface.
      def call(job_instance, job_hash, queue, &block)
        @runner.call(job_instance, job_hash, queue, &block)
      end

      # Sidekiq hands its configuration to middleware that takes it.
      def config=(config)
        @runner.attach(config)
      end
    end

    # The process-wide part of Middleware.
    class Runner # :nodoc:
      # How long to wait for jobs in flight before sending TERM anyway; Sidekiq
      # then gives them its shutdown timeout and pushes back what is left.
      WAIT_FOR_JOBS = 600

      # Without Sidekiq's :quiet event (no configuration handed over), how long
      # to give the TSTP before TERM.
      QUIET_GRACE = 2

      def initialize(**options)
        setup(**options)
      end

      # Listens for Sidekiq's :quiet lifecycle event, so TERM follows once the
      # quiet has taken effect: Ruby runs pending signal handlers lowest
      # number first, so a TERM (15) sent soon after TSTP (20) would be seen
      # first, and Sidekiq would go straight to its shutdown.
      def attach(config)
        first = @lock.synchronize { !@attached && (@attached = true) }
        config.on(:quiet) { @lock.synchronize { @quiet = true } } if first && config.respond_to?(:on)
      rescue ArgumentError
        nil
      end

      def call(_job_instance, _job_hash, _queue, &block)
        @lock.synchronize { @in_flight += 1 }
        begin
          _, _, body = @app.call({ "memkit.job" => block })
          body.close if body.respond_to?(:close)
        ensure
          @lock.synchronize { @in_flight -= 1 }
        end
      end

      private

      # max_uss, max_tree_pss, cgroup, jitter, check_every: as for
      #   Memkit::MemoryLimit ("%" limits are shares of the container's limit).
      # max_jobs: replace the process after this many jobs; nil for none.
      # oob_gc: false to leave GC to Ruby; or a Hash of Memkit::OobGC options.
      # logger: anything with #warn or #puts; default Sidekiq's logger.
      # stop: :signals (TSTP, then TERM, to this process) or a callable given
      #   the reason, for a process that stops some other way.
      def setup(max_uss: nil, max_jobs: nil, max_tree_pss: nil, cgroup: nil, jitter: 0.1, check_every: 1,
                oob_gc: true, logger: nil, stop: :signals)
        @logger = logger
        @stop = stop
        @lock = Mutex.new
        @in_flight = 0
        @stopping = false
        @attached = false
        @quiet = false
        unless stop == :signals || stop.respond_to?(:call)
          raise InvalidArgument, "Memkit::Sidekiq::Middleware: stop must be :signals or a callable (got #{stop.inspect})"
        end

        job = lambda do |env|
          env.fetch("memkit.job").call
          [200, {}, []]
        end
        app = oob_gc ? OobGC.new(job, **(oob_gc.is_a?(Hash) ? oob_gc : {})) : job
        limited = !(max_uss.nil? && max_jobs.nil? && max_tree_pss.nil?)
        @app = if limited
                 MemoryLimit.new(app, max_uss: max_uss, max_requests: max_jobs, max_tree_pss: max_tree_pss,
                                      cgroup: cgroup, jitter: jitter, check_every: check_every,
                                      replace: ->(reason) { replace(reason) }, logger: NullLog)
               else
                 app
               end
      end

      # Nothing to log: this middleware writes its own line.
      module NullLog
        def self.puts(*) = nil
      end

      def replace(reason)
        first = @lock.synchronize do
          next false if @stopping

          @stopping = true
        end
        return unless first

        stats = OobGC.stats
        log format("memkit: sidekiq %d %s; quieting it and stopping it once its jobs are done (GC between jobs: " \
                   "%d minor, %d major; inside jobs: %d)", Process.pid, reason.gsub(/\brequests\b/, "jobs"),
                   stats.oob_minor, stats.oob_major, stats.inside_total)
        return @stop.call(reason) unless @stop == :signals

        Process.kill("TSTP", Process.pid)
        Thread.new do
          start = Process.clock_gettime(Process::CLOCK_MONOTONIC)
          # The job that crossed the limit is still counted until its
          # middleware call returns, which is right after this.
          loop do
            waited = Process.clock_gettime(Process::CLOCK_MONOTONIC) - start
            done, quiet = @lock.synchronize { [@in_flight.zero?, @quiet || (!@attached && waited > QUIET_GRACE)] }
            break if (done && quiet) || waited > WAIT_FOR_JOBS

            sleep 0.05
          end
          Process.kill("TERM", Process.pid)
        end
      end

      def log(line)
        logger = @logger || (defined?(::Sidekiq) && ::Sidekiq.respond_to?(:logger) ? ::Sidekiq.logger : $stderr)
        logger.respond_to?(:warn) && !logger.is_a?(IO) ? logger.warn(line) : logger.puts(line)
      end
    end
  end
end
