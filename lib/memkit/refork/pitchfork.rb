# frozen_string_literal: true

require "memkit"
require "memkit/refork"

module Memkit
  module Refork
    # Runs a Refork::Policy in each Pitchfork worker and asks the monitor for
    # a refork with USR2, the signal Pitchfork documents for it; the monitor
    # then promotes a warm worker to be the new mold. The mold runs
    # Memkit.warmup before it forks anything.
    #
    # Create it at the top of the Pitchfork config file (which the monitor
    # evaluates, so Process.pid there is the monitor's) and call it from your
    # own hooks, which keeps whatever else those hooks do:
    #
    #   require "memkit/refork/pitchfork"
    #   memkit = Memkit::Refork::Pitchfork.new
    #   after_mold_fork { |server, mold| memkit.after_mold_fork(server, mold) }
    #   after_worker_fork { |server, worker| memkit.after_worker_fork(server, worker) }
    #   after_request_complete { |server, worker, env| memkit.after_request_complete(server, worker, env) }
    #
    # Each worker judges only itself (Pitchfork gives a worker no view of its
    # siblings), every `every` requests: its USS growth since its own fork,
    # what it still shares against the mold's RSS (measured in the mold after
    # warm-up and inherited by the workers it forks), and its request count.
    class Pitchfork
      attr_reader :policy, :last_decision, :last_warmup

      # policy:      a Refork::Policy (each worker has its own copy)
      # every:       check after every this many requests (reading smaps_rollup costs about a millisecond)
      # monitor_pid: the Pitchfork monitor (the process the config file runs in)
      # warmup:      keyword options for Memkit.warmup in the mold, or false to leave the mold alone
      def initialize(policy: Policy.new, every: 32, monitor_pid: Process.pid, warmup: {}, signal: :USR2)
        raise InvalidArgument, "every: must be an Integer >= 1, not #{every.inspect}" unless
          every.is_a?(Integer) && every >= 1
        raise InvalidArgument, "warmup: must be a Hash of Memkit.warmup options or false, not #{warmup.inspect}" unless
          warmup == false || warmup.is_a?(Hash)

        @policy = policy
        @every = every
        @monitor_pid = ProcFS.pid!(monitor_pid)
        @warmup = warmup
        @signal = signal
        @mold_rss = nil
        @uss_at_fork = 0
        @last_decision = nil
        @last_warmup = nil
      end

      # In the new mold, before it forks any worker.
      def after_mold_fork(server, _mold)
        if @warmup
          @last_warmup = report = Memkit.warmup(**@warmup)
          line = report.skipped ? "mold #{Process.pid}: heap already prepared (#{report.reason})" : warmup_line(report)
          info(server, line)
        end
        @mold_rss = Memkit.rss
      end

      # In each new worker: what it owns alone right after fork, to count growth from.
      def after_worker_fork(_server, _worker)
        @uss_at_fork = Memkit.memory.uss
      end

      # In the worker, after each request; checks every `every` requests.
      def after_request_complete(server, worker, _env = nil)
        count = worker.requests_count
        return unless (count % @every).zero?
        return if worker.respond_to?(:outdated?) && worker.outdated? # a newer mold exists: being replaced

        now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        @last_decision = decision = @policy.check([reading(count)], now: now)
        return decision unless decision.refork?

        info(server, "#{decision}; asking the monitor for a refork (SIG#{@signal} to #{@monitor_pid})")
        Process.kill(@signal, @monitor_pid)
        @policy.reforked!(now: now)
        decision
      end

      # This worker's Reading now.
      def reading(requests)
        memory = Memkit.memory
        Reading.new(pid: Process.pid, uss_growth: memory.uss - @uss_at_fork, shared: memory.shared,
                    parent_rss: @mold_rss || memory.rss, requests: requests)
      end

      private

      def warmup_line(report)
        format("mold %d: heap prepared for fork in %.0f ms: %s", Process.pid, report.duration * 1000,
               report.steps.join(", "))
      end

      def info(server, message)
        logger = server.respond_to?(:logger) ? server.logger : nil
        logger&.info("memkit: #{message}")
      end
    end
  end
end
