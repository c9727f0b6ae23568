# frozen_string_literal: true

require "memkit"
require "memkit/refork"

module Memkit
  module Refork
    # Runs a Refork::Policy in a Puma master with `fork_worker`, and asks Puma
    # to refork with SIGURG, the signal Puma documents for it (Puma 5 and later).
    #
    # With fork_worker, Puma forks worker 0 from the master and every other
    # worker from worker 0, so /proc alone shows the shape: the master's
    # grandchildren are the workers a refork replaces, and their parent is the
    # process they would be forked from again. Reading /proc rather than
    # Puma.stats_hash leaves Puma's own statistics alone (reading those resets
    # their per-interval maxima on Puma 7+).
    #
    # A worker's growth since fork is its USS: right after fork(2) every page
    # it has is shared with its parent, so all it owns alone is what it wrote
    # since (and pages its parent rewrote, which a refork shares again too).
    # Counting from when the watcher first saw it instead would miss whatever
    # a busy worker wrote in its first `interval` seconds.
    #
    # `plugin :memkit` starts one when fork_worker is on; to pass a policy of
    # your own, see docs/REFORK.md.
    class PumaWatcher
      attr_reader :policy, :last_decision

      # master_pid: the Puma master (the process this runs in)
      # policy:     a Refork::Policy (or anything with check(readings, now:) and reforked!(now:))
      # interval:   seconds between checks
      # log:        something with #log(String), e.g. Puma's log_writer or events; nil for silence
      # signal:     what to send the master for a refork
      def initialize(master_pid: Process.pid, policy: Policy.new, interval: 5.0, log: nil, signal: :URG)
        raise InvalidArgument, "interval: must be a positive number of seconds, not #{interval.inspect}" unless
          interval.is_a?(Numeric) && interval.positive?

        @master_pid = ProcFS.pid!(master_pid)
        @policy = policy
        @interval = interval
        @log = log
        @signal = signal
        @last_decision = nil
      end

      # Checks every `interval` seconds in a thread of its own until the
      # master exits.
      def start
        Thread.new do
          Thread.current.name = "memkit refork" if Thread.current.respond_to?(:name=)
          run
        end
      end

      # The same, in the calling thread. An error reading /proc ends one check, not the loop.
      def run
        loop do
          sleep @interval
          begin
            check
          rescue Memkit::Error, SystemCallError => e
            @log&.log("! memkit refork: check failed: #{e.class}: #{e.message}")
          end
        end
      end

      # One check: reads the workers, asks the policy, and signals the master
      # when it says so. Returns the Decision.
      def check(now: Process.clock_gettime(Process::CLOCK_MONOTONIC))
        decision = @policy.check(readings, now: now)
        @last_decision = decision
        if decision.refork?
          @log&.log("* memkit: #{decision}; asking Puma to refork (SIG#{@signal} to #{@master_pid})")
          Process.kill(@signal, @master_pid)
          @policy.reforked!(now: now)
        end
        decision
      end

      # The workers a refork would replace, one Reading each.
      def readings
        tree = Memkit.tree(@master_pid)
        by_pid = tree.nodes.to_h { |n| [n.pid, n] }
        workers = tree.nodes.select { |n| n.depth == 2 }
        workers.map do |node|
          Reading.new(pid: node.pid, uss_growth: node.memory.uss, shared: node.memory.shared,
                      parent_rss: by_pid.fetch(node.ppid).memory.rss, requests: nil)
        end
      end
    end
  end
end
