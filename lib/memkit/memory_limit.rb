# frozen_string_literal: true

require_relative "../memkit"
require_relative "after_reply"
require_relative "libc"
require_relative "out_of_band"
require_relative "cgroup"

module Memkit
  # Rack middleware that has a bloated worker replaced, gracefully, by the
  # server that runs it.
  #
  #   use Memkit::MemoryLimit, max_uss: "300MB"
  #   use Memkit::MemoryLimit, max_uss: "300MB", max_requests: 50_000
  #   use Memkit::MemoryLimit, max_tree_pss: "80%"   # of the container's memory limit
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
  #
  # max_tree_pss limits the whole server: the master and all its descendants,
  # by PSS, which counts each shared page once across them -- the figure that
  # adds up to what the tree really occupies (summed RSS counts shared pages
  # once per process). When the tree is over, only the largest worker (by
  # USS) is replaced; the others keep serving, and the next reading after its
  # replacement decides again (see TreePolicy). A size ending in "%" is a share
  # of the container's memory limit (Memkit::Cgroup), for max_uss too.
  class MemoryLimit
    # Each server's graceful stop, for one worker and for the whole server
    # (sent to the master): Puma's QUIT is its halt.
    SIGNALS = { unicorn: :QUIT, pitchfork: :QUIT, puma: :TERM }.freeze
    # Unicorn and Pitchfork act on a worker's SIGQUIT only when its wait for
    # the next connection wakes; sent mid-request on an idle server, that is
    # after half the server's `timeout` (30 s with `timeout 60`, measured on
    # Unicorn 6.1 and Pitchfork 0.18), with the bloated worker still there
    # and its replacement not yet forked. Sent again every REPEAT_EVERY
    # seconds, the signal wakes that wait.
    REPEAT = %i[unicorn pitchfork].freeze
    REPEAT_EVERY = 1
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
      # Puma's out_of_band hook (`plugin :memkit`, which calls it through
      # Memkit::OutOfBand, or `out_of_band { Memkit::OutOfBand.run }`). Puma
      # runs it with every thread idle and accepts nothing until it returns, so this is
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
        return false unless pending&.replace_from_hook

        sleep HOOK_HOLD
        true
      end

      # Whether Puma's out_of_band hook runs in this worker, through
      # Memkit::OutOfBand (the plugin) or a hook that calls .out_of_band.
      def hooked? = OutOfBand.hooked? || @lock.synchronize { @hook_pid == Process.pid } # :nodoc:

      def pending=(middleware) # :nodoc:
        @lock.synchronize { @pending = middleware }
      end
    end

    attr_reader :max_uss, :max_requests, :max_tree_pss, :jitter

    # max_uss: bytes, or a size string ("300MB", "1.5G"), or a share of the
    #   container's limit ("10%"); nil for no limit on each worker.
    # max_requests: replace a worker after this many requests; nil for none.
    # max_tree_pss: limit on the server tree's total PSS, as max_uss
    #   ("80%" = 80% of the container's memory limit); nil for none.
    # tree_check_interval: seconds between two readings of the tree in one
    #   worker (reading every process's smaps_rollup costs milliseconds).
    # cgroup: where "%" limits come from: nil for this process's memory
    #   cgroup, a Memkit::Cgroup::Reading, or a root directory holding a
    #   cgroup tree (Memkit::Cgroup.read(root:)).
    # jitter: each worker's limits are drawn between (1 - jitter) and 1 times
    #   the given ones.
    # check_every: read RSS every Nth request (1 = every request).
    # replace: :auto (pick by server), a signal name to send to this process,
    #   or a callable given the reason string.
    # logger: anything with #warn (Logger) or #puts (an IO); default $stderr.
    def initialize(app, max_uss: nil, max_requests: nil, max_tree_pss: nil, tree_check_interval: 5, cgroup: nil,
                   jitter: 0.1, check_every: 1, replace: :auto, logger: $stderr)
      @app = app
      @cgroup = cgroup
      @max_uss = size(max_uss, :max_uss)
      @max_tree_pss = size(max_tree_pss, :max_tree_pss)
      # A share is taken of the container's limit as it is at each reading of
      # the tree, so a limit changed at run time (docker update, a resized
      # pod) is followed.
      @tree_share = share(max_tree_pss)
      @tree_check_interval = tree_check_interval
      @max_requests = max_requests
      @jitter = jitter
      @check_every = check_every
      @replace = replace
      @logger = logger
      validate!
      # Ahead of OobGC's handler: a worker that is going has no use for a GC.
      OutOfBand.register(:memory_limit, order: 10) { MemoryLimit.out_of_band ? :stop : nil }
      @lock = Mutex.new
      @pid = nil
      @in_flight = 0
    end

    def call(env)
      @lock.synchronize { @in_flight += 1 }
      begin
        status, headers, body = @app.call(env)
      rescue Exception # the request is over, whatever ended it: an error, a timeout, a thread kill
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
      if @max_uss.nil? && @max_requests.nil? && @max_tree_pss.nil?
        raise InvalidArgument, "#{name}: give max_uss: (e.g. \"300MB\"), max_tree_pss: (e.g. \"80%\") or max_requests:"
      end
      unless @tree_check_interval.is_a?(Numeric) && @tree_check_interval >= 0
        raise InvalidArgument,
              "#{name}: tree_check_interval must be a number of seconds (got #{@tree_check_interval.inspect})"
      end
      raise InvalidArgument, "#{name}: max_uss must be more than 0 (got #{@max_uss})" if @max_uss&.zero?
      unless @max_requests.nil? || (@max_requests.is_a?(Integer) && @max_requests.positive?)
        raise InvalidArgument, "#{name}: max_requests must be a positive Integer (got #{@max_requests.inspect})"
      end
      unless @jitter.is_a?(Numeric) && @jitter >= 0 && @jitter <= 0.9
        raise InvalidArgument, "#{name}: jitter must be between 0 and 0.9 (got #{@jitter.inspect})"
      end
      unless @check_every.is_a?(Integer) && @check_every.positive?
        raise InvalidArgument, "#{name}: check_every must be a positive Integer (got #{@check_every.inspect})"
      end
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
      @next_tree_check = 0.0
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
      reason ||= tree_reason
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
    public :replace_from_hook # :nodoc: for MemoryLimit.out_of_band

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

      uss_check
    end

    # Reads the tree outside the lock (it takes milliseconds per process, and
    # the other threads' requests take the lock as they start), at most every
    # tree_check_interval seconds; claims the replacement under the lock.
    def tree_reason
      return unless @max_tree_pss

      due = @lock.synchronize do
        now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        next false if @reason || now < @next_tree_check

        @next_tree_check = now + @tree_check_interval
      end
      reason = due && tree_check
      reason && @lock.synchronize { @reason ? nil : (@reason = reason) }
    end

    # The server tree is this worker's parent (the master) and everything
    # under it. The workers that may be replaced are this one's siblings; when
    # this worker's title names it a worker (Unicorn, Puma cluster and
    # Pitchfork all do), only siblings whose titles do too, which leaves out
    # Pitchfork's mold and anything else the master runs.
    def tree_check
      tree = Memkit.tree(Process.ppid)
      me = Process.pid
      # The title as the kernel shows it: Pitchfork sets it with setproctitle,
      # which leaves $PROGRAM_NAME alone.
      titled = tree.nodes.find { |n| n.pid == me }&.command.to_s.include?("worker")
      workers = tree.nodes.select { |n| n.ppid == tree.pid && (n.pid == me || !titled || n.command.include?("worker")) }
      limit = @tree_share ? (cgroup_reading(:max_tree_pss).limit.to_i * @tree_share).round : @max_tree_pss
      return if limit.zero? # the container's limit is gone

      sizes = workers.to_h { |n| [n.pid, n.memory.uss] }
      reason = TreePolicy.new(limit: limit).decide(tree_pss: tree.total_pss, workers: sizes, me: me)
      reason && "#{reason} after #{@requests} requests"
    rescue Memkit::Error => e
      log "memkit: worker #{Process.pid} could not read the server tree (#{e.message}); will try again"
      nil
    end

    def uss_check
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
        from = @via_hook ? ", from Puma's out_of_band hook" : ""
        server = @server || "the server"
        log "memkit: worker #{Process.pid} #{reason}; asking #{server} to replace it (SIG#{signal}#{from})"
        Process.kill(signal, Process.pid)
        repeat(signal) if @replace == :auto && REPEAT.include?(@server)
      else
        why = if @server
                "Puma in single mode has no master to start a new worker"
              else
                "unknown server (SERVER_SOFTWARE #{@software.inspect}); pass replace: to MemoryLimit"
              end
        log "memkit: worker #{Process.pid} #{reason}; not restarting it: #{why}"
      end
    end

    # Until this process exits (see REPEAT).
    def repeat(signal)
      pid = Process.pid
      Thread.new do
        loop do
          sleep REPEAT_EVERY
          Process.kill(signal, pid)
        end
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

    # The share (0.8 for "80%"), or nil for a size.
    def share(value)
      percent = value.is_a?(String) && value.strip[/\A(\d+(?:\.\d+)?)\s*%\z/, 1]
      percent && Float(percent) / 100
    end

    # Bytes from a size ("300MB", 1024) or a share of the cgroup's limit ("80%").
    def size(value, option)
      return nil if value.nil?

      share = share(value)
      return Units.parse(value, "Memkit::MemoryLimit #{option}") unless share

      unless share.positive? && share <= 1
        raise InvalidArgument, "Memkit::MemoryLimit #{option}: #{value.inspect} must be more than 0% and at most 100%"
      end
      reading = cgroup_reading(option)
      unless reading.limited?
        raise InvalidArgument, "Memkit::MemoryLimit #{option}: #{value.inspect} is a share of the container's memory " \
                               "limit, and the memory cgroup #{reading.path} has none; give a size such as \"1GB\""
      end
      (reading.limit * share).round
    end

    def cgroup_reading(option)
      case @cgroup
      when Cgroup::Reading then @cgroup
      when nil then Cgroup.read
      when String then Cgroup.read(root: @cgroup)
      else
        raise InvalidArgument, "Memkit::MemoryLimit cgroup: must be nil, a root directory or a Memkit::Cgroup::Reading"
      end
    rescue Cgroup::NotFound => e
      raise InvalidArgument, "Memkit::MemoryLimit #{option}: a \"%\" limit needs a memory cgroup: #{e.message}"
    end

    def log(line)
      @logger.respond_to?(:warn) && !@logger.is_a?(IO) ? @logger.warn(line) : @logger.puts(line)
    end
  end
end

# After the class: TreePolicy reopens it (Memkit autoloads MemoryLimit from this file).
require_relative "memory_limit/tree_policy"
