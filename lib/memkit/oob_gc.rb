# frozen_string_literal: true

require_relative "../memkit"
require_relative "after_reply"
require_relative "oob_gc/collector"

module Memkit
  # Rack middleware that runs garbage collection between requests, when the
  # heap says the next request would otherwise pay for it.
  #
  #   use Memkit::OobGC
  #
  # After each response has been sent (rack.after_reply on Unicorn, Puma and
  # Pitchfork; rack.response_finished on other Rack 3 servers; the body's
  # close elsewhere) it compares what one request allocates (a high
  # percentile of the recent ones, per size pool, and malloc'd bytes) with
  # what the heap has left before Ruby would collect on its own, and runs
  # that GC now if the next request would cross it: minor when a minor would
  # be enough, major when Ruby would do a major anyway. The policy (when) is
  # OobGC::Policy, one per GC model; the work is OobGC::Collector, which
  # non-Rack code (a job loop) can use directly.
  #
  # A heap too small to hold one request after a GC is grown at run time,
  # bounded by max_heap_growth; stats say what it costs and which
  # RUBY_GC_HEAP_* values to set at boot instead. On Ruby 3.4+ Ruby's own
  # major GCs are turned off while serving (GC.config) and run here, between
  # requests, when Ruby says one is due. When OobGC cannot keep GC out of
  # requests it says why, once in the log and in stats.gave_up.
  #
  # GC runs only when no request is in flight in this process, so GCs
  # started by a Puma thread while another thread serves a request are not
  # called out of band.
  #
  # On Puma, `plugin :memkit` gives it Puma's out_of_band hook (or write
  # `out_of_band { Memkit::OutOfBand.run }`): Puma runs that hook once all
  # the worker's threads are idle and accepts no connection until it
  # returns, so a request that arrives during the GC goes to another worker.
  class OobGC
    # Requests a Puma worker serves before OobGC looks for Puma's
    # out_of_band hook (#check_hook). Puma calls the hook whenever the
    # worker's threads fall idle, which any load but a flood leaves a moment
    # for within the first requests.
    HOOK_GRACE = 100

    class << self
      # A frozen copy of this process's counters (see Stats).
      def stats = Counters.stats

      # Zeroes the counters, for a benchmark that wants to measure one phase.
      def reset_stats = Counters.reset

      # Puma's out_of_band hook: runs the GC a request found due, now that
      # the worker is idle and not accepting.
      def out_of_band = Counters.out_of_band

      def enter = Counters.enter # :nodoc:
      def leave(&block) = Counters.leave(&block) # :nodoc:
    end

    # Options: see Collector#initialize. enabled: false turns the middleware
    # into a pass-through, e.g. per environment.
    def initialize(app, enabled: true, **options)
      @app = app
      @enabled = enabled
      @collector = Collector.new(**options)
      @hook_checked = false # whether #check_hook is done
    end

    attr_reader :collector

    def call(env)
      return @app.call(env) unless @enabled

      check_hook(env) unless @hook_checked
      token = @collector.started
      begin
        status, headers, body = @app.call(env)
      rescue Exception # the request is over, whatever ended it
        Counters.leave
        raise
      end
      if @collector.major_next?(token)
        # A major GC will make this worker pause once the response is out
        # (100 ms and more on a large heap). A kept-alive client would send
        # its next request here and wait it out; told to close, it
        # reconnects, and a worker that is not collecting accepts it. Not for
        # minors: moving a connection leaves the workers unbalanced until the
        # next move, which cost saturated throughput more than the short
        # pause did (docs/BENCHMARKS.md).
        headers = headers.frozen? ? headers.dup : headers
        headers["connection"] = "close"
      end
      body = AfterReply.register(env, body) { @collector.finished(token) }
      [status, headers, body]
    end

    private

    # Puma 8 keeps accepting connections while its only thread runs a GC in
    # rack.after_reply, and those wait the GC out; it stops accepting only
    # while its out_of_band hook runs (Puma::Server#handle_servers). On
    # bench/oobgc_p99.rb "tiny", one request per connection, that was p99
    # 12x no OobGC's without the hook and 0.63x with it (docs/SERVERS.md).
    # So a Puma process whose hook has not run by its HOOK_GRACE-th request
    # says so, once. A process forked after it served (fork_worker's
    # reforks) inherits the answer with the config: Process.pid per request
    # costs a system call on Ruby 3.1 (1.3 us here, as much as half the
    # collector's bookkeeping).
    def check_hook(env)
      return @hook_checked = true unless env["SERVER_SOFTWARE"].to_s.start_with?("puma ")
      return @hook_checked = true if OutOfBand.installed? || Counters.hooked?
      return if Counters.stats.requests < HOOK_GRACE

      @hook_checked = true
      @collector.log&.call("memkit: OobGC in pid #{Process.pid} runs GC after the response while Puma " \
                           "still accepts connections, which then wait for it; add `plugin :memkit` to " \
                           "config/puma.rb (or `out_of_band { Memkit::OutOfBand.run }`)")
    end
  end
end
