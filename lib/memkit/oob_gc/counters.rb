# frozen_string_literal: true

module Memkit
  class OobGC
    # Process-wide counters: GC is process-wide, so are the figures about it.
    #
    # oob_hook: how many of the out-of-band runs Puma's out_of_band hook made.
    # watched: GC runs left to Ruby because OobGC had given up (see gave_up).
    # grow_runs: times the heap was grown at run time; heap_grown_bytes: the
    #   object pages that added (RSS), bounded by max_heap_growth.
    # heap_slots: the heap's slots now; heap_bytes: its object pages, with
    #   those Ruby will add as allocation needs them.
    # malloc_pad: the free bytes glibc keeps at the top of each malloc arena,
    #   as OobGC set them (MallocPad); 0 if it set none.
    # gave_up: why OobGC cannot keep GC out of requests, or nil.
    # boot_env: RUBY_GC_* values that would give this worker's heap the size
    #   OobGC wants from the start (Ruby reads them only at boot).
    # policy: the GC model in use (OneHeap, SizePools, NoFullMark).
    # profile: what one request allocates at the learned percentile.
    Stats = Struct.new(:requests, :oob_minor, :oob_major, :inside_minor, :inside_major, :oob_seconds, :oob_hook,
                       :watched, :grow_runs, :heap_grown_bytes, :heap_slots, :heap_bytes, :malloc_pad, :gave_up,
                       :boot_env, :policy, :profile, keyword_init: true) do
      def oob_total = oob_minor + oob_major
      def inside_total = inside_minor + inside_major

      # Share of all GC runs since the first request that happened outside requests.
      def outside_ratio
        total = oob_total + inside_total
        total.zero? ? 1.0 : oob_total.fdiv(total)
      end
    end

    # The process's request accounting: which GC runs happened with a
    # request in flight, and which collector waits for Puma's hook.
    module Counters
      ZERO = { requests: 0, oob_minor: 0, oob_major: 0, inside_minor: 0, inside_major: 0, oob_seconds: 0.0,
               oob_hook: 0, watched: 0, grow_runs: 0, heap_grown_bytes: 0, heap_slots: 0, heap_bytes: 0,
               malloc_pad: 0, gave_up: nil, boot_env: {}, policy: nil, profile: nil }.freeze
      # What reset zeroes; the rest describes the heap as it is.
      COUNTS = %i[requests oob_minor oob_major inside_minor inside_major oob_seconds oob_hook watched grow_runs].freeze

      @lock = Monitor.new
      @stats = Stats.new(**ZERO)
      @in_flight = 0
      @mark = nil       # GC.count when the process last became busy
      @mark_major = nil # and major_gc_count
      @hook_pid = nil # the process where Puma's out_of_band hook has run
      @pending = nil  # the collector that has a GC due, for that hook
      @gave_up = nil # pid of the process that logged giving up

      class << self
        attr_reader :lock

        def stats = @lock.synchronize { @stats.dup.freeze }

        def reset
          @lock.synchronize do
            COUNTS.each { |m| @stats[m] = ZERO.fetch(m) }
          end
        end

        # A request starts. The GC counts are taken when the process goes
        # from idle to busy, and again when it goes back: what happens in
        # between ran inside requests.
        def enter
          @lock.synchronize do
            if @in_flight.zero?
              @mark = GC.count
              @mark_major = GC.stat(:major_gc_count)
            end
            @in_flight += 1
          end
        end

        # A request has been answered. Yields (under the lock, so no request
        # can be counted as starting meanwhile) when the process has become idle.
        def leave
          @lock.synchronize do
            @in_flight -= 1
            @stats.requests += 1
            next unless @in_flight.zero?

            if @mark && (runs = GC.count - @mark).positive?
              major = GC.stat(:major_gc_count) - @mark_major
              @stats.inside_minor += runs - major
              @stats.inside_major += major
              @stats.watched += runs if @stats.gave_up
            end
            yield if block_given?
          end
        end

        def alone? = @lock.synchronize { @in_flight == 1 && yield }
        def idle? = @in_flight.zero?

        # Puma's out_of_band hook: runs the GC a collector found due.
        def out_of_band
          @lock.synchronize do
            @hook_pid = Process.pid
            pending = @pending
            @pending = nil
            @stats.oob_hook += pending.out_of_band if pending && @in_flight.zero?
          end
        end

        # Under the lock: leave the GC to the server's hook if it has run in
        # this process. Returns whether it was left.
        def defer(collector)
          return false unless hooked?

          @pending = collector
          true
        end

        def hooked? = @hook_pid == Process.pid

        def record(major, seconds)
          major ? @stats.oob_major += 1 : @stats.oob_minor += 1
          @stats.oob_seconds += seconds
        end

        def grew(bytes, runs: 1)
          @stats.grow_runs += runs
          @stats.heap_grown_bytes += bytes
        end

        def update(**fields) = @lock.synchronize { fields.each { |k, v| @stats[k] = v } }

        # Says why OobGC cannot keep GC out of requests: once per process in
        # the log, and in stats for as long as it holds.
        # The log line comes once per process: a worker forked from a process
        # that gave up says so itself.
        def give_up(reason, log)
          first = @gave_up != Process.pid
          @stats.gave_up = reason
          @gave_up = Process.pid
          log&.call("memkit: OobGC in worker #{Process.pid} cannot keep GC out of requests: #{reason}") if first
        end

        def recovered = (@stats.gave_up = nil)
      end
    end
  end
end
