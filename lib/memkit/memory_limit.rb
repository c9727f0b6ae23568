# frozen_string_literal: true

require_relative "after_reply"
require_relative "libc"

module Memkit
  # Rack middleware that has a bloated worker replaced, gracefully, by the
  # server that runs it.
  #
  #   use Memkit::MemoryLimit, max_uss: "300MB"
  #   use Memkit::MemoryLimit, max_uss: "300MB", max_requests: 50_000
  #
  # After every response it reads RSS from /proc/self/statm (microseconds).
  # Only when RSS is over the limit does it read USS, the memory that exiting
  # would free, from smaps_rollup: RSS also counts pages shared with the
  # master and the other workers, so it overstates what a restart gains. Over
  # the limit, it first runs a full GC and malloc_trim(0) (glibc), which often
  # gives enough back; if USS is still over, it asks the server for a
  # replacement, the server's own graceful way:
  #
  # * Unicorn and Pitchfork: SIGQUIT to this worker, which makes it finish the
  #   request in hand, stop accepting and exit; the master forks a new one.
  # * Puma in cluster mode: SIGTERM to this worker, which tells the master it
  #   is going, stops accepting, finishes requests in flight, closes idle
  #   keep-alive connections and exits; the master boots a new worker on its
  #   next check (worker_check_interval).
  #
  # Puma in single mode (no master to start another) and unknown servers are
  # never signalled: the middleware logs once and carries on, unless given
  # replace: with a callable.
  #
  # Each worker picks its own limits within jitter below the ones given, so
  # workers that started together do not all restart together.
  class MemoryLimit
    SIGNALS = { unicorn: :QUIT, pitchfork: :QUIT, puma: :TERM }.freeze
    # Requests a busy Puma worker may still serve, over its limit, while
    # waiting for an idle moment to ask for its replacement.
    LINGER = 50
    # How long Puma's out_of_band hook holds the worker's accept loop after
    # SIGTERM (see .out_of_band).
    HOOK_HOLD = 0.05

    @lock = Mutex.new
    @hook_pid = nil # the process where Puma's out_of_band hook has run
    @pending = nil  # the middleware waiting for that hook to replace its worker

    class << self
      # Puma's out_of_band hook (`plugin :memkit`, or
      # `out_of_band { Memkit::MemoryLimit.out_of_band }`). Puma runs it with
      # every thread idle and accepts nothing until it returns, so this is
      # where a draining worker sends itself SIGTERM: it then keeps the hook
      # for HOOK_HOLD, time for Puma's trap to queue the stop, which its
      # accept loop handles before any connection, and for a connection
      # accepted just before to deliver its request (Puma closes one whose
      # request has not arrived at shutdown). Returns true if it did.
      def out_of_band
        pending = @lock.synchronize do
          @hook_pid = Process.pid
          @pending.tap { @pending = nil }
        end
        return false unless pending&.send(:replace_from_hook)

        sleep HOOK_HOLD
        true
      end

      def hooked? = @lock.synchronize { @hook_pid == Process.pid } # :nodoc:

      def pending=(middleware) # :nodoc:
        @lock.synchronize { @pending = middleware }
      end
    end

    attr_reader :max_uss, :max_requests, :jitter

    # max_uss: bytes, or a size string ("300MB", "1.5G"); nil for no memory limit.
    # max_requests: replace a worker after this many requests; nil for none.
    # jitter: each worker's limits are drawn between (1 - jitter) and 1 times
    #   the given ones.
    # check_every: read RSS every Nth request (1 = every request).
    # replace: :auto (pick by server), a signal name to send to this process,
    #   or a callable given the reason string.
    # logger: anything with #warn (Logger) or #puts (an IO); default $stderr.
    def initialize(app, max_uss: nil, max_requests: nil, jitter: 0.1, check_every: 1,
                   replace: :auto, logger: $stderr)
      @app = app
      @max_uss = max_uss.nil? ? nil : Units.parse(max_uss, "Memkit::MemoryLimit max_uss")
      @max_requests = max_requests
      @jitter = jitter
      @check_every = check_every
      @replace = replace
      @logger = logger
      validate!
      @lock = Mutex.new
      @pid = nil
      @in_flight = 0
    end

    def call(env)
      @lock.synchronize { @in_flight += 1 }
      begin
        status, headers, body = @app.call(env)
      rescue Exception # rubocop:disable Lint/RescueException -- the request is over whatever ended it
        @lock.synchronize { @in_flight -= 1 }
        raise
      end
      if @draining
        # Puma decides keep-alive itself but passes the header on, and clients
        # honour it: they take their next request to another worker.
        headers = headers.frozen? ? headers.dup : headers
        headers["connection"] = "close"
        @closed += 1
      end
      body = AfterReply.register(env, body) { finished(env) }
      [status, headers, body]
    end

    # This worker's own limits (after jitter), or nil before its first request.
    def limits
      @limits&.dup
    end

    private

    def validate!
      name = "Memkit::MemoryLimit"
      raise InvalidArgument, "#{name}: give max_uss: (e.g. \"300MB\") or max_requests:" if @max_uss.nil? && @max_requests.nil?
      raise InvalidArgument, "#{name}: max_uss must be more than 0 (got #{@max_uss})" if @max_uss&.zero?
      unless @max_requests.nil? || (@max_requests.is_a?(Integer) && @max_requests.positive?)
        raise InvalidArgument, "#{name}: max_requests must be a positive Integer (got #{@max_requests.inspect})"
      end
      raise InvalidArgument, "#{name}: jitter must be between 0 and 0.9 (got #{@jitter.inspect})" unless @jitter.is_a?(Numeric) && @jitter >= 0 && @jitter <= 0.9
      raise InvalidArgument, "#{name}: check_every must be a positive Integer (got #{@check_every.inspect})" unless @check_every.is_a?(Integer) && @check_every.positive?
      return if @replace == :auto || @replace.respond_to?(:call)

      begin
        Signal.signame(Signal.list.fetch(@replace.to_s.delete_prefix("SIG").upcase))
      rescue KeyError
        raise InvalidArgument, "#{name}: replace must be :auto, a signal name or a callable (got #{@replace.inspect})"
      end
    end

    # Limits, counters and the server are per process: the middleware is built
    # in the master (preload) and then runs in every forked worker.
    def start_worker(env)
      @pid = Process.pid
      random = Random.new
      @limits = {
        max_uss: @max_uss && (@max_uss * (1 - @jitter * random.rand)).round,
        max_requests: @max_requests && [(@max_requests * (1 - @jitter * random.rand)).round, 1].max
      }.freeze
      @requests = 0
      @reason = nil
      @draining = false
      @replaced = false
      @via_hook = false
      @closed = 0
      @quiet_until_rss = 0
      @server = server(env)
    end

    def finished(env)
      reason = @lock.synchronize do
        @in_flight -= 1
        start_worker(env) unless @pid == Process.pid
        next if @reason

        @requests += 1
        @reason = check
      end
      return unless reason

      @server == :puma && @replace == :auto ? drain_then_replace : replace(reason)
    end

    # Puma 8.0 answers 500 to a keep-alive request that is ready when a worker
    # starts shutting down with no idle thread to take it
    # (https://github.com/puma/puma/issues/4015). So a Puma worker first tells
    # clients to close their connections ("connection: close" on every
    # response), and sends itself SIGTERM once it has done so at least once and
    # has no request in flight: from Puma's out_of_band hook when it has one
    # (.out_of_band), else from a thread that polls for that moment. Either
    # way it also goes once it has had no idle moment for a second, or has
    # served LINGER more requests. Idle keep-alive connections left in Puma's
    # reactor are closed cleanly at shutdown.
    def drain_then_replace
      @draining = true
      hooked = self.class.hooked?
      self.class.pending = self if hooked
      Thread.new do
        since = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        loop do
          sleep 0.02
          idle = @lock.synchronize { @in_flight.zero? }
          now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
          since = now unless idle
          break if (idle && @closed.positive? && !hooked) || now - since > 1 || @closed > LINGER
          break if @lock.synchronize { @replaced }
        end
        replace_once
      end
    end

    # From Puma's out_of_band hook: true if this worker is now going.
    def replace_from_hook
      unless @lock.synchronize { @closed.positive? && @in_flight.zero? }
        self.class.pending = self # not yet: at a later idle moment
        return false
      end
      @via_hook = true
      replace_once
    end

    def replace_once
      go = @lock.synchronize { !@replaced && (@replaced = true) }
      replace(@reason) if go
      go
    end

    # The reason to replace this worker, or nil.
    def check
      max_req = @limits[:max_requests]
      if max_req && @requests >= max_req
        return "served #{@requests} requests (limit #{max_req} = #{@max_requests} less jitter)"
      end
      max_uss = @limits[:max_uss]
      return unless max_uss && (@requests % @check_every).zero?

      rss = Memkit.rss
      # RSS is at least USS, so under the line nothing more is needed; and
      # after a USS read that came back under, wait for RSS to grow 1% more
      # before paying for smaps_rollup again.
      return if rss <= max_uss || rss < @quiet_until_rss

      uss = Memkit.memory.uss
      if uss > max_uss
        GC.start(full_mark: true, immediate_sweep: true)
        trimmed = !Libc.malloc_trim.nil?
        before = uss
        uss = Memkit.memory.uss
        rss = Memkit.rss
        if uss > max_uss
          return format("uss %s > limit %s (rss %s; was %s before GC%s) after %d requests",
                        Units.human(uss), Units.human(max_uss), Units.human(rss), Units.human(before),
                        trimmed ? " and malloc_trim" : "", @requests)
        end
      end
      @quiet_until_rss = rss + rss / 100
      nil
    end

    def replace(reason)
      how = @replace
      how = SIGNALS[@server] if how == :auto
      if how.respond_to?(:call)
        log "memkit: worker #{Process.pid} #{reason}; replacing it"
        how.call(reason)
      elsif how
        signal = how.to_s.delete_prefix("SIG").upcase
        log "memkit: worker #{Process.pid} #{reason}; asking #{@server || 'the server'} to replace it (SIG#{signal}#{@via_hook ? ", from Puma's out_of_band hook" : ''})"
        Process.kill(signal, Process.pid)
      else
        log "memkit: worker #{Process.pid} #{reason}; not restarting it: #{@server ? 'Puma in single mode has no master to start a new worker' : 'unknown server (SERVER_SOFTWARE ' + @software.inspect + '); pass replace: to MemoryLimit'}"
      end
    end

    # :unicorn, :pitchfork, :puma (cluster mode only) or nil.
    def server(env)
      @software = env["SERVER_SOFTWARE"].to_s
      case @software
      when /\AUnicorn/i then :unicorn
      when /\APitchfork/i then :pitchfork
      when /\APuma/i then puma_cluster?(env) ? :puma : nil
      end
    end

    # Puma puts its Configuration in the env; workers > 0 is cluster mode,
    # where a worker that exits is replaced. Puma's own worker title is the
    # fallback (Puma sets $0 to "puma: cluster worker N: MASTER_PID").
    def puma_cluster?(env)
      config = env["puma.config"]
      workers = config.options[:workers] if config.respond_to?(:options)
      return workers.to_i.positive? unless workers.nil?

      $PROGRAM_NAME.include?("cluster worker")
    rescue StandardError
      $PROGRAM_NAME.include?("cluster worker")
    end

    def log(line)
      @logger.respond_to?(:warn) && !@logger.is_a?(IO) ? @logger.warn(line) : @logger.puts(line)
    end
  end
end
