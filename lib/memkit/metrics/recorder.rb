# frozen_string_literal: true

require_relative "../after_reply"

module Memkit
  class Metrics
    # Rack middleware that leaves this worker's counters in the server's
    # metrics Store after requests, at most once per `interval` seconds, so a
    # scrape answered by any process reports every worker:
    #
    #   use Memkit::Metrics::Recorder   # first, so it runs after OobGC's GC
    #
    # It writes after the response has gone (rack.after_reply and friends),
    # never while the client waits. A worker's counters are therefore as of
    # its last request (at most `interval` s older); an idle worker's stay as
    # they were, which is also what they are.
    #
    # The worker's index and role come from the server hook
    # (Memkit::Metrics.worker_booted, see docs/METRICS.md), else from the
    # process title Unicorn, Puma and Pitchfork give their workers. The
    # hook also writes the record at once, so a replacement takes over its
    # predecessor's record before its first request.
    class Recorder
      Identity = Struct.new(:pid, :role, :worker, :master, :dir, keyword_init: true)

      @lock = Mutex.new
      @writing = Mutex.new # one writer at a time per process: Puma's threads share the temporary file's name
      @identity = nil   # this process's Identity; stale after a fork (pid differs)
      @written_at = nil # monotonic time of the last write in this process
      @warned = false

      class << self
        # Called by the server hook in a new worker (or mold). index: the
        # server's worker index, nil for a mold. master: the master's pid
        # (default: found from the process titles, see Title.master). dir:
        # the Store directory (default: Store.default_dir(master)).
        def boot(index, role: :worker, master: nil, dir: nil)
          index = index.nil? ? nil : Integer(index)
          raise InvalidArgument, "Memkit::Metrics.worker_booted: index must be >= 0 (got #{index})" if index&.negative?

          role = role.to_sym
          raise InvalidArgument, "Memkit::Metrics.worker_booted role: :worker or :mold, not #{role.inspect}" unless %i[worker mold].include?(role)

          master = master ? ProcFS.pid!(master) : Title.master(Process.ppid)
          @lock.synchronize do
            @identity = Identity.new(pid: Process.pid, role: role, worker: index, master: master,
                                     dir: (dir || Store.default_dir(master)).to_s)
          end
          record(force: true)
        end

        # This process's identity: from the hook, else from its title and its
        # ancestors' (a process that names no role records as its own master:
        # Puma in single mode, a plain rackup).
        def identity(dir: nil)
          @lock.synchronize do
            id = @identity
            return id if id && id.pid == Process.pid

            role, index = Title.parse(Tree.command(Process.pid))
            master = role ? Title.master(Process.ppid) : Process.pid
            @written_at = nil
            @identity = Identity.new(pid: Process.pid, role: role || :master, worker: index, master: master,
                                     dir: (dir || Store.default_dir(master)).to_s)
          end
        end

        # Writes this process's record unless one was written less than
        # `interval` s ago. A failure to write is logged once, and never
        # reaches the request.
        def record(interval: 0, force: false, dir: nil, logger: $stderr)
          now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
          id = identity(dir: dir)
          return false if !force && @written_at && now - @written_at < interval
          # Another thread is writing this very record: its figures will do.
          return false unless @writing.try_lock

          begin
            @written_at = now
            Store.new(id.dir).write({ pid: id.pid, role: id.role, worker: id.worker, master: id.master, **Counters.read })
          ensure
            @writing.unlock
          end
          true
        rescue Error => e
          unless @warned
            @warned = true
            logger&.puts "memkit: metrics: #{e.message} (this worker's counters are left out of scrapes)"
          end
          false
        end

        # Whether this process has an identity yet: a scrape answered here
        # refreshes the record first.
        def active? = @lock.synchronize { @identity&.pid == Process.pid }
      end

      # interval: the least number of seconds between two writes by one
      # worker. dir: the Store directory, when not the default one.
      def initialize(app, interval: 1.0, dir: nil, logger: $stderr)
        raise InvalidArgument, "Memkit::Metrics::Recorder interval: expected seconds >= 0, got #{interval.inspect}" unless interval.is_a?(Numeric) && interval >= 0

        @app = app
        @interval = interval
        @dir = dir
        @logger = logger
      end

      def call(env)
        status, headers, body = @app.call(env)
        [status, headers, AfterReply.register(env, body) { Recorder.record(interval: @interval, dir: @dir, logger: @logger) }]
      end
    end

    # This process's counters as numbers, for the Store: Ruby's GC, and
    # Memkit::OobGC's and Memkit::MemoryLimit's when the app uses them.
    module Counters
      module_function

      def read
        stat = GC.stat
        counters = { gc_minor: stat.fetch(:minor_gc_count), gc_major: stat.fetch(:major_gc_count),
                     heap_live_slots: stat.fetch(:heap_live_slots), heap_free_slots: stat.fetch(:heap_free_slots) }
        counters[:gc_time_ms] = stat[:time] if stat.key?(:time)
        # Only when the app loaded them: autoload? is nil once a constant is loaded.
        unless Memkit.autoload?(:OobGC)
          s = Memkit::OobGC.stats
          counters.merge!(oobgc_requests: s.requests, oobgc_minor: s.oob_minor, oobgc_major: s.oob_major,
                          oobgc_inside_minor: s.inside_minor, oobgc_inside_major: s.inside_major,
                          oobgc_seconds: s.oob_seconds.to_f, oobgc_watched: s.watched)
        end
        if !Memkit.autoload?(:MemoryLimit) && Memkit::MemoryLimit.respond_to?(:stats)
          Memkit::MemoryLimit.stats.to_h.each do |key, value|
            counters[:"memory_limit_#{key}"] = value if value.is_a?(Numeric)
          end
        end
        counters
      end
    end
  end
end
