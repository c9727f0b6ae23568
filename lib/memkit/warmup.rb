# frozen_string_literal: true

require_relative "../memkit"
require_relative "libc"
require_relative "malloc_release"
require_relative "warmup/app"

module Memkit
  # Prepares the Ruby heap so that children forked afterwards keep sharing
  # it with the parent. Memkit.warmup(**options) calls Warmup.run.
  #
  # Why a forked child writes to pages it never changed, and the step below
  # that answers each (docs/FORK.md has the measurements):
  # - promote: up to Ruby 3.2 an object's GC age lives in its header; each GC
  #   that marks a young object bumps it, dirtying its page in the child.
  #   A few GCs in the parent age every survivor to "old" once, before fork.
  # - coderange: a String caches "is it 7-bit / valid" in its header the
  #   first time anything asks; asking every string once here moves those
  #   writes before fork (Process.warmup does the same on 3.3).
  # - compact: the child allocates into free slots of partly filled pages,
  #   copying each such page; GC.compact packs survivors into fewer pages.
  # - trim: glibc keeps freed chunks inside pages the child shares and hands
  #   them out again; malloc_trim(0) returns whole free pages to the kernel.
  # - fill malloc holes (fill: :malloc, the default where memkit runs its own
  #   steps): glibc gives a process's main thread the main arena, the brk
  #   heap the master booted in, full of free chunks in pages every child
  #   shares. A child serving requests on its main thread (Unicorn, Resque,
  #   Pitchfork) mallocs into those holes and copies each page. Filling them
  #   with chunks that stay sends its mallocs to fresh memory instead: on the
  #   Rails bench app (3.1, Unicorn) the tree 0.87x of the same steps without
  #   it (docs/BENCHMARKS.md). Puma serves on pool threads, whose arenas are
  #   their own, so there it changes little.
  # - fill object slots too (fill: true): what compaction leaves free is
  #   filled with objects that stay. Whether that pays depends on what
  #   starts a worker's GCs, which the app warm-up requests (app:) measure:
  #   - an app whose requests allocate many objects (the Rails bench app:
  #     ~5,300 objects and a net malloc of about 0 per request) runs out of free slots long
  #     before it has malloc'd enough to start a GC: the free slots are its
  #     working space, and filling them makes every worker grow its heap
  #     instead (Rails, 3.1, Unicorn: the tree 1.12x larger);
  #   - an app whose requests allocate few objects and much malloc'd memory
  #     (bench app: ~60 objects and ~32 KB) starts its GCs from malloc long
  #     before the free slots run out. Those slots are then no working space
  #     but a reservoir where the GC's lazy sweep finds room and stops, so
  #     the dead objects and their malloc'd buffers further on stay unswept:
  #     measured, a worker's malloc'd memory kept growing between GCs to
  #     102-108 MB, against 70-78 MB with the slots filled, and glibc keeps
  #     the peak.
  #   So fill: :auto fills the slots when, by the warm-up's median request
  #   after the first, the free slots would outlast the malloc budget
  #   (heap_free_slots / objects per request > malloc_increase_bytes_limit /
  #   malloc bytes per request); report.gc_forecast says what it compared.
  #   Without app warm-up requests it does not, nor on a heap of several
  #   slot sizes (3.2+; see single_slot_size?). The rule errs on the safe
  #   side: on a small app shape (scale 0.1) it kept the slots where filling
  #   them would still have paid (docs/BENCHMARKS.md, "CoW on the app shape").
  #
  # - malloc_release (after fork, in the children): a worker keeps in glibc
  #   the most garbage it held between two GCs; MallocRelease gives that back
  #   after each major GC. On the app shape this is most of a worker's
  #   private memory, on every Ruby, with or without Process.warmup.
  #
  # Where Process.warmup exists (Ruby 3.3+) it does promote, compact, free
  # empty pages, coderange and malloc_trim in C; memkit calls it instead, so
  # the default there is exactly the built-in.
  #
  # Adaptive: the heap counters at the end of a run are remembered, and the
  # next run returns at once (report.skipped) while fewer than `threshold`
  # objects were allocated since; while fewer than 10% of the live objects
  # were, it only ages the new ones with minor GCs (steps [:touch_up]). So a server hook and the memkit/fork hook
  # can both call it before the same fork without doing the work twice.
  module Warmup
    DEFAULTS = { force: false, threshold: 10_000, max_gcs: 8, promote: true, coderange: true,
                 compact: :auto, trim: true, fill: :auto, process_warmup: :auto, malloc_release: true,
                 app: nil, requests: nil, logger: nil }.freeze

    # What a run did. Durations in seconds, sizes in bytes.
    Report = Struct.new(:skipped, :reason, :duration, :steps, :gc_runs, :young_before, :young_after,
                        :slots_freed, :pages_freed, :bytes_trimmed, :slots_filled, :bytes_filled, :rss_before, :rss_after,
                        :requests, :gc_forecast, keyword_init: true) do
      # The app warm-up requests that raised or answered 5xx.
      def failures = Array(requests).select(&:failed?)

      def to_h = super.merge(steps: steps.dup, requests: Array(requests).map(&:to_h))
    end

    @state = nil
    @last_report = nil
    @runs = 0
    @lock = Mutex.new
    @warmed_apps = {}.compare_by_identity
    @profile = nil

    class << self
      # Options (all keywords):
      #   force:          true runs every step even if nothing changed (default false)
      #   threshold:      allocations since the last run below which it is a no-op (10_000)
      #   max_gcs:        most GCs spent promoting young objects (8)
      #   promote, coderange, trim: true/false, each step on its own (true)
      #   fill:           :malloc fills the malloc arena's holes, true also every
      #                   free object slot, false neither; :auto = :malloc where
      #                   memkit runs its own steps, nothing after Process.warmup,
      #                   and the slots too where the app warm-up measured that
      #                   they would outlast the malloc budget, on a heap of one
      #                   slot size (:auto)
      #   compact:        true, false, or :auto = where GC.compact exists and
      #                   Process.warmup does not (it compacts itself) (:auto)
      #   process_warmup: true, false or :auto = use Process.warmup where it exists
      #   malloc_release: true starts MallocRelease in this process, so that
      #                   it and the children forked from it give glibc's free
      #                   memory back after each major GC (true)
      #   app:            a Rack app to send `requests` through first, in this
      #                   process, before the heap steps (Warmup::App); once
      #                   per app per process, so a before_fork hook that runs
      #                   before every worker's fork sends them once
      #   requests:       Strings (GET paths) and Hashes (Rack envs); ["/"] when
      #                   app: is given without them
      #   logger:         where a failed request's line goes: nil = stderr,
      #                   a Logger, or an IO
      def run(**options)
        opts = validate(options)
        if @lock.owned?
          return Report.new(skipped: true, reason: :locked, duration: 0.0, steps: [], gc_runs: 0, requests: [])
        end

        @lock.synchronize do
          requests = warm_app(opts)
          @last_report = perform(opts)
          @last_report.requests = requests
          if opts[:malloc_release] && !MallocRelease.started? && MallocRelease.start
            @last_report.steps << :malloc_release
          end
          @runs += 1 unless @last_report.skipped
          @last_report
        end
      end

      # The report of the latest call, and how many calls did work, in this
      # process (a forked child inherits its parent's): for a worker to show
      # how its master was prepared.
      attr_reader :last_report, :runs

      # Allocations since the last run, or nil when there was none in this
      # heap. Used by memkit/fork to decide in microseconds.
      def allocations_since_last
        @state && GC.stat(:total_allocated_objects) - @state
      end

      # Forget the last run, so the next one does all the work.
      def reset!
        @state = nil
        @warmed_apps.clear
        @profile = nil
        @last_report = nil
        @runs = 0
      end

      def young_objects
        GC.stat(:heap_live_slots) - GC.stat(:old_objects)
      end

      def malloc_trim_available? = Libc.malloc_trim?

      # How many of the warm-up's typical requests (profile: { objects:,
      # malloc_bytes: } per request) a worker forked now could serve before
      # its free slots run out, and before its malloc'd bytes start a GC;
      # nil without a profile. The malloc count is net (Ruby subtracts what
      # it frees), as the GC sees it: a request that frees as much as it
      # mallocs never starts a GC from malloc (requests_until_malloc_gc nil).
      def gc_forecast(profile, free_slots:, malloc_limit:)
        return nil unless profile && profile[:objects].positive?

        slots = free_slots.fdiv(profile[:objects])
        malloc = (malloc_limit.fdiv(profile[:malloc_bytes]) if profile[:malloc_bytes].positive?)
        { objects_per_request: profile[:objects], malloc_bytes_per_request: profile[:malloc_bytes],
          requests_until_slots_run_out: slots.floor, requests_until_malloc_gc: malloc&.floor,
          slots_outlast_malloc: !malloc.nil? && slots > malloc }
      end

      private

      def validate(options)
        unknown = options.keys - DEFAULTS.keys
        unless unknown.empty?
          raise InvalidArgument, "unknown warmup option#{'s' if unknown.size > 1}: #{unknown.join(', ')} " \
                                 "(known: #{DEFAULTS.keys.join(', ')})"
        end

        opts = DEFAULTS.merge(options)
        raise InvalidArgument, "warmup requests: given without app:" if opts[:requests] && opts[:app].nil?
        opts[:app_warmup] = App.new(opts[:app], opts[:requests] || ["/"], logger: opts[:logger]) if opts[:app]
        unless [true, false, :malloc, :auto].include?(opts[:fill])
          raise InvalidArgument, "warmup fill: must be true, false, :malloc or :auto, not #{opts[:fill].inspect}"
        end
        %i[force promote coderange trim malloc_release].each do |key|
          next if [true, false].include?(opts[key])

          raise InvalidArgument, "warmup #{key}: must be true or false, not #{opts[key].inspect}"
        end
        %i[compact process_warmup].each do |key|
          raise InvalidArgument, "warmup #{key}: must be true, false or :auto, not #{opts[key].inspect}" unless [true, false, :auto].include?(opts[key])
        end
        %i[threshold max_gcs].each do |key|
          raise InvalidArgument, "warmup #{key}: must be an Integer >= 0, not #{opts[key].inspect}" unless opts[key].is_a?(Integer) && opts[key] >= 0
        end
        raise InvalidArgument, "warmup compact: true, but this Ruby has no GC.compact" if opts[:compact] == true && !GC.respond_to?(:compact)
        raise InvalidArgument, "warmup process_warmup: true, but this Ruby has no Process.warmup" if opts[:process_warmup] == true && !Process.respond_to?(:warmup)

        opts
      end

      # The app's requests, unless this app was warmed in this process already.
      def warm_app(opts)
        app = opts[:app_warmup] or return []
        return [] if @warmed_apps.key?(opts[:app])

        @warmed_apps[opts[:app]] = true
        results = app.run
        @profile = App.allocation_profile(results) || @profile
        results
      end

      def perform(opts)
        since = allocations_since_last
        if !opts[:force] && since && since < opts[:threshold]
          return Report.new(skipped: true, reason: :unchanged, duration: 0.0, steps: [], gc_runs: 0,
                            young_before: young_objects, young_after: young_objects,
                            slots_freed: 0, pages_freed: 0, bytes_trimmed: 0)
        end

        started = clock
        before = GC.stat
        gc_before = GC.count
        rss_before = rss
        steps = []
        bytes_trimmed = 0
        # GC.start and GC.compact run even under GC.disable; the caller's
        # choice to keep the GC off for its own allocations is left as it was.
        if !opts[:force] && since && since < GC.stat(:heap_live_slots) / 10
          # Little changed (a master that polls, a Resque parent between
          # jobs): only the new objects need aging. Compaction, the string
          # walk and filling again would cost far more than they would save.
          steps << :touch_up if opts[:promote] && promote_young(opts[:max_gcs])
        elsif process_warmup?(opts)
          Process.warmup
          steps << :process_warmup
        else
          steps << :promote if opts[:promote] && promote(opts[:max_gcs])
          steps << :coderange if opts[:coderange] && coderange
          steps << :compact if compact?(opts) && compact
          # A full GC after everything: no lazy sweep may be left for the
          # child to finish, since sweeping writes freelists into pages.
          GC.start(full_mark: true, immediate_sweep: true)
        end
        if opts[:trim] && (steps & %i[process_warmup touch_up]).empty? && (trimmed = trim)
          steps << :trim
          bytes_trimmed = trimmed
        end
        if opts[:fill] == :auto && !steps.include?(:touch_up)
          forecast = gc_forecast(@profile, free_slots: GC.stat(:heap_free_slots),
                                           malloc_limit: GC.stat(:malloc_increase_bytes_limit))
        end
        fill_mode = if opts[:fill] != :auto then opts[:fill]
                    elsif forecast && forecast[:slots_outlast_malloc] && single_slot_size? then true
                    elsif !steps.include?(:process_warmup) then :malloc
                    end
        if fill_mode == :malloc && !steps.include?(:touch_up)
          bytes_filled = fill_malloc_holes
          steps << :fill_malloc
        elsif fill_mode && !steps.include?(:touch_up)
          slots_filled, bytes_filled = fill(opts[:max_gcs])
          steps << :fill
        end
        after = GC.stat
        @state = GC.stat(:total_allocated_objects)
        reason = if opts[:force] then :forced
                 elsif since.nil? then :first
                 elsif steps.include?(:touch_up) then :changed_little
                 else :changed
                 end
        Report.new(skipped: false, reason: reason,
                   duration: clock - started, steps: steps, gc_runs: GC.count - gc_before,
                   young_before: before[:heap_live_slots] - before[:old_objects],
                   young_after: after[:heap_live_slots] - after[:old_objects],
                   slots_freed: [before[:heap_live_slots] - after[:heap_live_slots], 0].max,
                   pages_freed: [before[:heap_allocated_pages] - after[:heap_allocated_pages], 0].max,
                   bytes_trimmed: bytes_trimmed, slots_filled: slots_filled.to_i, bytes_filled: bytes_filled.to_i,
                   rss_before: rss_before, rss_after: rss, gc_forecast: forecast)
      end

      # The fill makes every filler an Object, which lives in the smallest
      # slot size. Where the heap has several slot sizes (GC.stat_heap, 3.2+)
      # it grows that one and leaves the others' free slots as they were:
      # on the app shape under Puma on 3.4 the forecast-driven fill left the
      # tree 1.15x larger (docs/BENCHMARKS.md, "CoW on the app shape"). So :auto fills slots
      # only on a heap of one slot size.
      def single_slot_size?
        !GC.respond_to?(:stat_heap) || GC.stat_heap.size <= 1
      end

      def process_warmup?(opts)
        opts[:process_warmup] == true || (opts[:process_warmup] == :auto && Process.respond_to?(:warmup))
      end

      def compact?(opts)
        opts[:compact] == true || (opts[:compact] == :auto && GC.respond_to?(:compact))
      end

      # A major GC frees the boot garbage first (so it is not promoted), then
      # minor GCs age the survivors until the old generation stops growing.
      # Objects that are not write-barrier protected never become old, and
      # are never aged either, so "stopped growing" is the end, not zero.
      def promote(max_gcs)
        return false if max_gcs.zero?

        GC.start(full_mark: true, immediate_sweep: true)
        age_until_stable(max_gcs - 1, done: 1)
        true
      end

      # An object becomes old after surviving 3 GCs, so the first GCs may
      # promote nothing; after that, stop once the old generation stops growing.
      def age_until_stable(budget, done: 0)
        old = GC.stat(:old_objects)
        budget.times do |i|
          GC.start(full_mark: false, immediate_sweep: true)
          now = GC.stat(:old_objects)
          break if now <= old && done + i + 1 >= 3

          old = now
        end
      end

      # The child allocates into whatever free space the parent left: each
      # free object slot and each free malloc chunk sits in a page the child
      # shares, and writing into it copies the page. Filling that space with
      # objects and chunks that live forever sends the child's allocations to
      # fresh pages instead. It costs nothing the parent was not already
      # holding: the slots and chunks were resident (trim ran first).
      def fill(max_gcs)
        # malloc first: its own bookkeeping allocates, and a full GC then
        # frees that garbage before the slots are counted and filled.
        bytes = fill_malloc_holes
        GC.start(full_mark: true, immediate_sweep: true)
        slots = GC.stat(:heap_free_slots)
        (@filled ||= []) << Array.new(slots) { Object.new }
        # The fillers are young: age them like everything else.
        [max_gcs, 4].min.times { GC.start(full_mark: false, immediate_sweep: true) }
        [slots, bytes]
      end

      # glibc only, and only where mallinfo2's struct comes back through a
      # hidden pointer argument as Fiddle calls it (x86-64 System V).
      # Mallocs of falling sizes until one comes from the top chunk, which is
      # fresh memory: everything before it came from a hole.
      def fill_malloc_holes
        return 0 unless Libc.malloc_trim? && (info = Libc.mallinfo2) && (heap_end = Libc.program_break)

        top_start = heap_end - info.keepcost
        filled = 0
        [65_536, 16_384, 4096, 1024, 256, 64, 16].each do |size|
          loop do
            address = Libc.malloc_address(size).to_i
            break if address.zero? || address >= top_start - 64

            filled += size
          end
        end
        filled
      end

      # Minor GCs only, until the old generation stops growing.
      def promote_young(max_gcs)
        return false if max_gcs.zero?

        age_until_stable([max_gcs, 4].min)
        true
      end

      # String#ascii_only? computes the coderange and caches it in the header.
      def coderange
        ObjectSpace.each_object(String) do |s|
          s.ascii_only?
        rescue StandardError
          next # a string of a dummy encoding, or one a C extension made odd
        end
        true
      end

      def compact
        GC.compact
        true
      rescue NotImplementedError
        false # GC.compact exists but the platform cannot move objects
      end

      # Bytes the process's RSS shrank by, or nil where there is no glibc
      # malloc_trim (musl, macOS). With jemalloc preloaded it is harmless.
      def trim
        return nil unless Libc.malloc_trim?

        before = rss
        Libc.malloc_trim
        before ? [before - rss.to_i, 0].max : 0
      end

      # nil where there is no /proc (memkit's readers are Linux only).
      def rss
        Memkit.rss
      rescue Memkit::Error
        nil
      end

      def clock = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end
  end
end
