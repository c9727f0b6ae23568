# frozen_string_literal: true

require "monitor"
require_relative "../errors"
require_relative "../gc_rest"
require_relative "../malloc_release"
require_relative "profile"
require_relative "policy"
require_relative "counters"
require_relative "heap_growth"
require_relative "dry_growth"
require_relative "rss_budget"
require_relative "malloc_pad"
require_relative "../out_of_band"

module Memkit
  class OobGC
    # Out-of-band GC for any server: call #started when a unit of work
    # begins (a request, a job) and #finished with what it returned once the
    # work's result has gone out. Between the two nothing is collected; at
    # #finished, if the heap says the next unit would start a GC, it runs
    # now. A Sidekiq-style loop:
    #
    #   collector = Memkit::OobGC::Collector.new
    #   token = collector.started
    #   perform(job)
    #   collector.finished(token)
    #
    # Several collectors in one process share the process's counters; a GC
    # runs only when no unit is in flight in any of them.
    class Collector
      # Requests apart that GCs must come for collecting one request early to
      # cost at most 1.1x Ruby's GC runs: (N + 1) / N = 1.1 at N = 10. Also
      # what a collected heap is sized for (see #initialize).
      COVER = 10
      # The heap growth's bound besides max_heap_growth: the worker's RSS at
      # the top of a GC cycle may grow by this share of what it was before any
      # growth (see RssBudget), so that a sized worker stays within 1.3x the
      # RSS it would have without OobGC.
      RSS_SHARE = 0.2

      DEFAULTS = { headroom: 1.1, percentile: 0.95, window: 200, max_heap_growth: 64 << 20, regrow_after: 100,
                   full_mark: :auto, malloc_pad: true }.freeze

      # What #quiet remembers of a reading in which nothing was due: the GC
      # count, objects allocated per pool and in all, malloc'd bytes, the
      # policy's margins, the profile's version, and whether the GC due next
      # would be a minor with oldmalloc still `oldmalloc_room` bytes short of
      # its limit.
      # learned: the profile's [objects, malloc] the margins were taken with;
      # need: the major Ruby had asked for then (need_major_by), if any.
      Quiet = Struct.new(:count, :base, :total, :malloc, :margins, :version, :learned, :minor, :oldmalloc_room, :need)

      # Whether GC.latest_gc_info says when Ruby has asked for a major (3.3+).
      NEED_MAJOR = GC.latest_gc_info.key?(:need_major_by)

      # Ruby's size pools, found once: nil where Ruby has one heap (3.1).
      POOLS = if GC.respond_to?(:stat_heap) && GC.stat_heap(0).key?(:total_allocated_objects)
                (0...(GC::INTERNAL_CONSTANTS[:SIZE_POOL_COUNT] || GC::INTERNAL_CONSTANTS[:HEAP_COUNT] ||
                      GC.stat_heap.size)).to_a.freeze
              end

      # A reading of the heap, as the policies take it.
      def self.reading
        { stat: GC.stat, heaps: POOLS&.map { |i| GC.stat_heap(i) }, info: GC.latest_gc_info }
      end

      # Slots per pool (their pages).
      def self.eden_slots
        POOLS.map { |i| GC.stat_heap(i, :heap_eden_slots) }
      end

      # Objects allocated so far, per pool: one single-key GC.stat call each
      # (a full GC.stat Hash costs ten times more).
      def self.allocated
        if POOLS
          counts = Array.new(POOLS.size)
          i = 0
          while i < counts.size
            counts[i] = GC.stat_heap(i, :total_allocated_objects)
            i += 1
          end
          counts
        else
          [GC.stat(:total_allocated_objects)]
        end
      end

      attr_reader :policy, :profile, :log

      # headroom: requests' worth of allocation that must remain free before
      #   the next GC for the collector to leave the heap alone (1 = exactly
      #   the next request at the learned percentile; each 0.1 more collects
      #   earlier, and more often than Ruby would: with N requests between
      #   GCs, about N / (N - headroom + 1) times Ruby's count).
      # percentile, window: the request profile (see Profile).
      # max_heap_growth: bytes of object pages the collector may add to the
      #   heap at run time, so that a collected heap holds the next requests
      #   (0 turns growing off; boot_env in stats still says what to set).
      # regrow_after: requests between two steps of growth, and before growing
      #   again a heap Ruby has shrunk (Ruby 3.1-3.3: on 3.4 the heap grows
      #   by the plan DryGrowth makes at each GC).
      # full_mark: on Ruby 3.4+ (GC.config), :auto stops Ruby's own major
      #   GCs while serving and runs them between requests; true leaves them
      #   to Ruby.
      # malloc_pad: true to have glibc keep, at the top of each malloc arena,
      #   the memory the next requests malloc again (MallocPad), once the
      #   worker has served `regrow_after` requests; false to leave glibc's
      #   settings alone.
      # log: a callable taking one line (default: warn).
      def initialize(headroom: DEFAULTS[:headroom], percentile: DEFAULTS[:percentile], window: DEFAULTS[:window],
                     max_heap_growth: DEFAULTS[:max_heap_growth], regrow_after: DEFAULTS[:regrow_after],
                     full_mark: DEFAULTS[:full_mark], malloc_pad: DEFAULTS[:malloc_pad], log: ->(line) { warn(line) },
                     policy: nil)
        unless headroom.is_a?(Numeric) && headroom >= 1
          raise InvalidArgument, "Memkit::OobGC: headroom must be a number >= 1 (got #{headroom.inspect})"
        end
        unless max_heap_growth.is_a?(Integer) && max_heap_growth >= 0
          raise InvalidArgument,
                "Memkit::OobGC: max_heap_growth must be an Integer >= 0 (got #{max_heap_growth.inspect})"
        end
        unless [:auto, true].include?(full_mark)
          raise InvalidArgument, "Memkit::OobGC: full_mark must be :auto or true (got #{full_mark.inspect})"
        end
        unless [true, false].include?(malloc_pad)
          raise InvalidArgument, "Memkit::OobGC: malloc_pad must be true or false (got #{malloc_pad.inspect})"
        end

        @profile = Profile.new(window: window, percentile: percentile)
        klass = policy || Policy.detect
        klass = Policy::SizePools if klass == Policy::NoFullMark && full_mark == true
        @policy = klass.new(headroom: headroom)
        @growth = HeapGrowth.new(max_bytes: max_heap_growth)
        @rss_budget = RssBudget.new(share: RSS_SHARE)
        @rss_top = nil # RSS just before the latest out-of-band GC, where growth is on
        # Twice the most malloc'd bytes Ruby lets build up before a GC.
        @malloc_pad = (MallocPad.shared(max_bytes: 2 * @policy.malloc_limit_max) if malloc_pad)
        @regrow_after = regrow_after
        @regrow_wait = regrow_after # doubled after each growth Ruby refused
        @log = log
        @cover = headroom + 1 # after a GC: the next request, and one more
        # What a collected heap is sized for (where max_heap_growth, the RSS
        # bound and Ruby's free-share limit allow): each pool holds `@want`
        # times the free slots at which the collector runs a GC, and one more,
        # so that it runs at most 1.1x the GCs of Ruby alone at that heap
        # (Policy#shortfall). From the heap's first sizing on: the profile
        # has settled by then (a worker's first requests, where a Rails app
        # compiles its templates, have left it). A heap sized for `cover`
        # first and for `want` only later grows in steps while the worker
        # serves: a Rails worker on 3.4, sized for `want` from its 100th
        # request, ran 1.13-1.17x the GC runs of Ruby alone at the heap it
        # ended with (docs/BENCHMARKS.md).
        @want = [@cover, COVER].max
        @hook_headroom = headroom + 1
        @seen = 0 # units of work finished
        @cycle = [nil, 0] # GC.count, and @seen when it was last seen to change
        @grown_at = nil # @seen when the heap was last grown
        @swept = nil # GC.count whose sweep #finish_long_sweep last looked at
        @full_mark_off = nil # pid where GC.config(rgengc_allow_full_mark: false) was set
        @no_full_mark = @policy.is_a?(Policy::NoFullMark)
        @dry = DryGrowth.new(policy: @policy, growth: @growth) if @no_full_mark
        @quiet = nil # see #quiet
        @bounded = false # whether the growth budget's RSS share is set (Ruby 3.4, #grow)
        OutOfBand.register(:oob_gc, order: 50) { OobGC.out_of_band }
        Counters.update(policy: @policy.name)
      end

      # A unit of work starts. Returns the token to give #finished.
      def started
        Counters.enter
        full_mark_off if @no_full_mark
        # The last unit's end, when nothing was collected since: what the
        # server allocates between units then counts in the next one, as it
        # does in the heap's margins.
        last = @last
        return last if last && last[0] == GC.count

        [GC.count, Collector.allocated, GC.stat(:malloc_increase_bytes)]
      end

      # The unit's result has gone out. Returns the GCs run now (0 if none,
      # or if the server's out_of_band hook will run it).
      def finished(token)
        ran = 0
        Counters.leave do
          count = GC.count
          now = Collector.allocated
          malloc = GC.stat(:malloc_increase_bytes)
          learn(token, count, now, malloc)
          malloc = GC.stat(:malloc_increase_bytes) if finish_long_sweep(count)
          @last = [count, now, malloc]
          @cycle = [GC.count, @seen] if @dry&.spent(@seen - @cycle[1])
          next if quiet?(count, now, malloc)

          @quiet = nil
          reading = self.class.reading
          @policy.observe(reading, allocated_before: token[1].sum)
          valve(reading)
          due, reading = decide(reading, @policy.headroom)
          if due
            next if gave_up?(reading) && !(due == :major && @no_full_mark)

            ran = run(due, reading)
            @cycle = [GC.count, @seen]
            reading = self.class.reading
          elsif Counters.hooked? && @seen - @cycle[1] >= COVER
            # Where Puma's out_of_band hook runs, a GC one request early goes
            # there, while the worker accepts nothing; the hook does not run if
            # the next request is already queued, and then the GC above runs
            # after that request instead, still between requests. Only where
            # GCs come at least COVER requests apart, so that one request
            # early costs at most 1.1x the GCs: on an app that mallocs 8 MB a
            # request, where they come every six, it cost 1.6x.
            early, reading = decide(reading, @hook_headroom)
            if early
              Counters.defer(self)
              next
            end
          end
          quiet(reading)
        end
        ran
      rescue StandardError => e
        failed(e)
      end

      # Whether a major GC will run once this unit has finished (only the
      # last unit in flight runs one). For the Rack middleware's
      # "connection: close".
      def major_next?(_token)
        # No major can be due, or nothing at all: no need to take the lock
        # (this only reads).
        return false if minor_at_most? || quiet_so_far?

        Counters.alone? do
          next false if @profile.empty?

          reading = self.class.reading
          due = @policy.decide(reading, @profile)
          major = due == :major || (due == :minor && @policy.oldmalloc_over?(reading))
          major && !(@starved_at && capacity(reading) <= @starved_at)
        end
      end

      # From Puma's out_of_band hook (via Counters.out_of_band), with no unit
      # in flight: the heap as it is now decides. Returns the GCs run.
      def out_of_band
        @quiet = nil
        @last = nil
        reading = self.class.reading
        @policy.observe(reading)
        due, reading = decide(reading, @hook_headroom)
        return 0 unless due && !gave_up?(reading)

        ran = run(due, reading, headroom: @hook_headroom)
        @cycle = [GC.count, @seen]
        ran
      rescue StandardError => e
        failed(e)
      end

      private

      # Both entry points run once the response has gone out, where a server
      # drops what they raise (Puma's after_reply and out_of_band hooks log
      # it only in debug mode): a GC that failed to run between requests
      # then runs inside one, and nothing said why. So it is said like any
      # other reason (Counters.give_up), and the request is not disturbed.
      # Returns the GCs run (0).
      def failed(error)
        Counters.give_up("#{error.class}: #{error.message} (#{error.backtrace&.first})", @log)
        0
      end

      # The GC the policy finds due at `headroom`, and the reading it decided
      # on. A GC found due mid-sweep is decided again once the sweep is done,
      # as Ruby finishes it before its next GC: the frees of the garbage's
      # malloc'd memory lower malloc_increase, and the slots it frees are not
      # counted free until swept. Decided on the reading mid-sweep, a GC due
      # for malloc'd bytes runs every third request of the "malloc" shape (8
      # MB a request) where Ruby alone runs one every sixth. Where the GC that
      # left the sweep lazy did not size the heap (#run), it is sized before
      # the next one, the sweep done by then. A minor GC found due while pools
      # the last growth left out have not taken their pages is decided again
      # once they have (DryGrowth#take_left).
      def decide(reading, headroom)
        due, reading = decide_swept(reading, headroom)
        return [due, reading] unless due == :minor && @dry&.take_left

        reading = self.class.reading
        [@policy.decide(reading, @profile, headroom: headroom), reading]
      end

      # The policy's GC due, the sweep finished and the heap sized first
      # where that changes it.
      def decide_swept(reading, headroom)
        due = @policy.decide(reading, @profile, headroom: headroom)
        return [due, reading] unless due && (@unsized || reading.fetch(:info)[:state] == :sweeping)

        reading = finish_sweep(reading)
        if (unsized = @unsized)
          @unsized = nil
          count, base = unsized
          # After a GC of Ruby's since, the next GC of this process sizes.
          if count == reading.fetch(:stat).fetch(:count)
            size(as_collected(reading, base))
            reading = self.class.reading # growth may have run GCs
          end
        end
        [@policy.decide(reading, @profile, headroom: headroom), reading]
      end

      # `reading` (no sweep under way, no GC since the last) as the heap
      # stood right after the last GC, when `base` objects per pool had been
      # allocated: what was allocated since is all still there. Sized on the
      # heap as it is when the next GC is due, every pool looked short by
      # nearly what the requests since had used: on the "tiny" shape (3.4) a
      # 200,000-slot growth of the main pool, RSS 1.37x no OobGC.
      def as_collected(reading, base)
        heaps = reading[:heaps] or return reading

        heaps = heaps.each_with_index.map do |h, i|
          h.merge(total_allocated_objects: base.fetch(i, h.fetch(:total_allocated_objects)))
        end
        reading.merge(heaps: heaps)
      end

      # A unit during which a GC ran says nothing about malloc growth (Ruby
      # reset the counter), but its object allocation is still right.
      def learn(token, count, now, malloc)
        started, before, malloc_before = token
        grown = malloc - malloc_before
        @profile.record_since(now, before, count == started ? (grown.negative? ? 0 : grown) : nil)
        @seen += 1
        @cycle = [count, @seen] if count != @cycle[0]
      end

      # A GC run between units leaves its sweep to the next units, which
      # sweep as they allocate, so that the pause between them stays short
      # (Policy#sweep_lazily?). A unit that allocates few objects sweeps few
      # pages, and until a page is swept its garbage holds the malloc'd
      # memory it points at; the frees the sweep makes meanwhile lower
      # Ruby's malloc counter, so no GC comes due for malloc either. On the
      # "malloc" bench shape (8 MB malloc'd and 3,600 objects a request,
      # Ruby 3.4), in a heap OobGC had grown, one sweep ran through 11
      # requests and over 100 MB, where Ruby alone's, its heap smaller, ran
      # through 6. Ruby alone collects once a malloc limit's worth has been
      # malloc'd since its last GC and not freed; so once the units since the
      # GC have malloc'd a limit's worth (at the learned percentile), a sweep
      # still under way is finished between units (docs/BENCHMARKS.md,
      # "A sweep that holds malloc'd memory"). Returns whether one was.
      def finish_long_sweep(count)
        return false if @swept == count || @profile.empty? || !@profile.malloc.positive?
        return false if (@seen - @cycle[1]) * @profile.malloc < GC.stat(:malloc_increase_bytes_limit)

        @swept = count
        return false unless GC.latest_gc_info(:state) == :sweeping

        GCRest.finish
        true
      end

      # The common case, answered without a reading: after a reading in which
      # nothing was due (even at the hook's headroom), nothing is due until a
      # GC runs, the learned profile changes, or the allocation since passes
      # one of the policy's margins (Policy#margins). Taking the reading
      # (GC.stat, GC.stat_heap per pool, GC.latest_gc_info as Hashes) after
      # every request cost 6-17 us a request.
      def quiet?(count, now, malloc)
        q = @quiet or return false
        return false unless count == q.count && (q = relearned(q))
        # Ruby may ask for a major at the end of a lazy sweep, with no GC run.
        return false if major_asked?(q)

        q.margins.holds?(now, q.base, malloc - q.malloc)
      end

      # #quiet? for the middleware, mid-request: the objects allocated in all
      # pools since the reading, against the smallest pool margin (one call,
      # not one per pool), and per pool only where that is not enough.
      def quiet_so_far?
        q = @quiet or return false
        count = GC.count
        return false unless count == q.count && (q = relearned(q))
        return false if major_asked?(q)

        malloc = GC.stat(:malloc_increase_bytes)
        least = q.margins.least
        if least.nil? || GC.stat(:total_allocated_objects) - q.total > least
          return quiet?(count, Collector.allocated, malloc)
        end

        (m = q.margins.malloc).nil? || malloc - q.malloc <= m
      end

      # Whether the GC the next unit's end may run is a minor at most: the
      # kind Policy#kind answered at the last reading, with no GC run since
      # and oldmalloc still short of its limit.
      def minor_at_most?
        q = @quiet or return false
        return false unless q.minor && GC.count == q.count
        return false if major_asked?(q)

        GC.stat(:malloc_increase_bytes) - q.malloc <= q.oldmalloc_room
      end

      # Whether Ruby asks for a major (3.3+; 3.1 does not say) that the
      # policy has not turned down, or that it had not asked for at the
      # reading of the quiet stretch `q`: a major turned down still changes
      # what Ruby lets the requests allocate (Policy::NoFullMark#kept_back),
      # so the margins are taken again. Turned down by a reading the
      # middleware took mid-request (#major_next?), the quiet stretch kept
      # margins from before: on the "cache" shape (3.4, Puma) GCs inside
      # requests with the policy finding a minor due.
      def major_asked?(q)
        return false unless NEED_MAJOR && (need = GC.latest_gc_info(:need_major_by))

        need != q.need || !@policy.declined?(need, q.count)
      end

      # The quiet stretch `q`, its margins moved to what the profile has
      # learned since (Policy#remargin), or nil where they cannot be.
      def relearned(q)
        return q if @profile.version == q.version

        learned = @profile.learned
        margins = @policy.remargin(q.margins, q.learned, learned, headroom: @hook_headroom)
        @quiet = margins && q.dup.tap do |moved|
          moved.margins = margins
          moved.version = @profile.version
          moved.learned = learned
        end
      end

      # Remembers, from a reading with nothing due, how far the quiet
      # stretch goes.
      def quiet(reading)
        margins = @policy.margins(reading, @profile, headroom: @hook_headroom)
        return @quiet = nil unless margins

        stat = reading.fetch(:stat)
        base = if (heaps = reading[:heaps])
                 heaps.map { |h| h.fetch(:total_allocated_objects) }
               else
                 [stat.fetch(:total_allocated_objects)]
               end
        @quiet = Quiet.new(stat.fetch(:count), base, stat.fetch(:total_allocated_objects),
                           stat.fetch(:malloc_increase_bytes), margins, @profile.version,
                           @profile.learned, @policy.kind(reading) == :minor,
                           stat.fetch(:oldmalloc_increase_bytes_limit) - stat.fetch(:oldmalloc_increase_bytes),
                           reading.fetch(:info)[:need_major_by])
      end

      # Returns how many GCs it ran. `headroom`: the one #decide found the
      # GC due at (the hook's is larger: there a GC runs a request early).
      def run(kind, reading, headroom: @policy.headroom)
        runs = 1
        @rss_top = HeapGrowth.rss if !@no_full_mark && (@growth.budget.positive? || @rss_top)
        if @malloc_pad && @seen >= @regrow_after
          Counters.update(malloc_pad: @malloc_pad.cover(reading.fetch(:stat).fetch(:malloc_increase_bytes)))
        end
        lazy = @policy.sweep_lazily?(reading, @profile, kind: kind, apart: @seen - @cycle[1])
        collect(kind, reading, lazy, headroom)
        after = self.class.reading
        # A minor GC that leaves less than the minimum free share of the heap
        # makes Ruby's next GC a major one: better now than in the next request.
        if kind == :minor && (@policy.major_next?(after) || @policy.major_due?(after, @profile))
          collect(:major, after, lazy, headroom)
          runs += 1
          after = self.class.reading
        end
        # Mid-sweep, only a policy that can read the sweep knows what is
        # free; elsewhere the heap is sized once the sweep is done (#decide).
        # [GC count, objects allocated per pool] after a GC left unsized.
        @unsized = ([GC.count, Collector.allocated] if lazy && after.fetch(:info)[:state] == :sweeping &&
                                                       !@policy.lazy_sweep?(after))
        unless @unsized
          size(after)
          starve(self.class.reading)
        end
        runs
      end

      def collect(kind, reading, lazy, headroom)
        started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        reading = finish_sweep(reading)
        @policy.collecting(reading, kind)
        majors = GC.stat(:major_gc_count)
        ran = kind == :minor && @dry&.run_due_minor(reading, @profile)
        ran ||= kind == :minor && @policy.malloc_due?(reading, @profile, headroom: headroom) &&
                overrun_malloc(reading, sweep: !lazy)
        GC.start(full_mark: kind == :major, immediate_sweep: !lazy) unless ran
        # A GC Ruby started (DryGrowth, #overrun_malloc) is a major if Ruby
        # had one pending that the reading did not show (3.1 does not say).
        kind = :major if ran && GC.stat(:major_gc_count) != majors
        Counters.record(kind == :major, Process.clock_gettime(Process::CLOCK_MONOTONIC) - started)
        @policy.collected(kind, self.class.reading)
        @dry&.take_dried(@profile)
        # Its trim after a major, here between requests rather than at its
        # thread's next look, which may fall inside one.
        MallocRelease.check
      end

      # Ruby finishes the last GC's lazy sweep before it starts the next, and
      # only then checks oldmalloc against its limit; the sweep's frees lower
      # oldmalloc. Read before the sweep, an overrun the sweep undid made the
      # collector run a major Ruby had not asked for, which lowers the limit
      # 2%: on the malloc shape with MallocRelease on Ruby 3.1, a forced major
      # every six requests (67 majors in 400 requests, 7 without the
      # release). Returns the reading the GC will start from.
      def finish_sweep(reading)
        return reading unless reading.fetch(:info)[:state] == :sweeping

        GCRest.finish
        self.class.reading
      end

      # After a GC: if the heap cannot hold the next requests, grow it
      # (from a settled profile, bounded by max_heap_growth), and record what
      # the heap costs and what to set at boot for it.
      def size(reading)
        grow(reading) if @profile.settled?
        Counters.update(heap_slots: GC.stat(:heap_available_slots), heap_bytes: HeapGrowth.page_bytes,
                        heap_grown_bytes: @growth.grown_bytes,
                        boot_env: @policy.boot_env(self.class.reading, @profile, cover: @cover), profile: @profile.to_h)
      end

      # Grows the heap where it cannot hold the next requests, within the
      # budget.
      def grow(reading)
        if @no_full_mark
          # Ruby 3.4's growth by running a pool dry: bounded by pages and by
          # a share of the RSS when the heap is first sized. A growth's pages
          # count only once taken (DryGrowth#plan). A second share, once the
          # worker has served `regrow_after` requests, grows the heap well
          # after its warm-up (a 160-byte pool by 24,000 slots at a Puma
          # worker's 464th request) and took the "large" shape past the RSS
          # line (1.31x no OobGC, docs/BENCHMARKS.md). Measured RSS (RssBudget)
          # stopped it on the app that mallocs 8 MB per request, whose RSS
          # swings by more than the bound between GCs: 328 GCs where this ran
          # 160 (docs/BENCHMARKS.md, "OobGC on the Rails app").
          unless @bounded
            @bounded = true
            rss = HeapGrowth.rss
            @growth.allow((rss * RSS_SHARE).to_i) if rss
          end
        elsif @rss_top
          @growth.allow(@rss_budget.bytes(@rss_top, @growth.grown_bytes))
        end
        if @no_full_mark
          # Grown by the next minor GC due instead: no GC of its own.
          @dry.plan(reading, @profile, cover: @cover, want: @want)
          short = []
        else
          short = @policy.shortfall(reading, @profile, cover: @cover, want: @want)
        end
        if short.any?(&:positive?) && @growth.budget.positive? &&
           (@grown_at.nil? || @seen - @grown_at >= @regrow_wait)
          @grown_at = @seen
          # A heap that cannot hold the next `cover` requests grows as far as
          # it must at once; beyond that, one of Ruby's growth steps at a time,
          # `regrow_after` requests apart, so that the RSS each step costs is
          # measured (RssBudget) before the next. The budget gives way only
          # to keep GC out of requests: a step past it is for a heap the next
          # request may run dry (Policy#cramped?, a heap also short of
          # `cover`). On Ruby 3.1 a worker of the "medium" shape, 1 slot
          # short of `cover`, took a 24 MB step where 20 MB were left, RSS
          # 1.34x no OobGC's (docs/BENCHMARKS.md). And to a step Ruby alone
          # would take (Policy#below_minimum): not a cost of OobGC's sizing.
          # On "huge" (Ruby 3.3) the main pool's step did not fit in the share,
          # so it never grew and ran a GC after every request, 2.3x Ruby
          # alone's GC runs at 0.72x its RSS.
          starving = @policy.shortfall(reading, @profile, cover: @cover).any?(&:positive?)
          ruby_would = @policy.below_minimum(reading)&.any?(&:positive?)
          added = @growth.grow(short, @policy, rounds: starving ? HeapGrowth::ROUNDS : 1, pages: starving,
                                               one_past: @policy.cramped?(reading, @profile) || ruby_would,
                                               order: @policy.driest_first(reading, @profile.objects))
          if added
            Counters.grew(added)
            after = self.class.reading
            @policy.collected(@growth.last_kind, after)
            # Each attempt costs major GCs: one that won Ruby over less than
            # half the slots asked for (or, one step at a time, none) waits
            # twice as long before the next.
            still = @policy.shortfall(after, @profile, cover: @cover, want: @want)
            @refused = starving ? still.sum > short.sum / 2 : added.zero?
            @regrow_wait = @refused ? @regrow_wait * 2 : @regrow_after
          end
        end
      end

      # Runs the GC due for malloc'd bytes as Ruby's own: mallocs (without
      # touching) what is left below the malloc limit, so that Ruby collects
      # for the overrun. At that GC Ruby raises the limit to 1.4 times what was
      # malloc'd (up to RUBY_GC_MALLOC_LIMIT_MAX), as it does when a request
      # overruns it, where a GC Ruby did not start for malloc lowers it by 2%:
      # collected out of band by GC.start, the limit never rose and an app
      # that mallocs megabytes a request collected every two or three of them
      # (docs/BENCHMARKS.md, "OobGC: GC runs per request"). Ruby sweeps its
      # GC lazily; with `sweep` the sweep is finished at once. Returns
      # whether Ruby collected.
      def overrun_malloc(reading, sweep: false)
        stat = reading.fetch(:stat)
        bytes = stat.fetch(:malloc_increase_bytes_limit) - GC.stat(:malloc_increase_bytes) + 1
        return false unless bytes.positive?

        count = GC.count
        String.new(capacity: bytes)
        return false if GC.count == count

        GCRest.finish if sweep
        true
      end

      # A heap that even just collected cannot hold one request gains
      # nothing from collecting early: the request will collect anyway. Set
      # after an out-of-band GC, once the profile has settled (the heap is
      # not grown before); holds until the heap has grown.
      def starve(reading)
        return unless @profile.settled?

        # A verdict to say out loud rests on the sweep's counts, not on an
        # estimate that errs low.
        if reading.fetch(:info)[:state] == :sweeping && @policy.starved?(reading, @profile)
          reading = finish_sweep(reading)
        end
        if @policy.starved?(reading, @profile)
          @starved_at = capacity(reading)
          reason = if @growth.budget.zero? && !@refused
                     "one request allocates more than the heap holds free after a GC, and max_heap_growth is spent"
                   else
                     "one request allocates more than the heap holds free after a GC, and Ruby would not grow it"
                   end
          env = @policy.boot_env(reading, @profile, cover: @cover).map { |k, v| "#{k}=#{v}" }.join(" ")
          Counters.give_up("#{reason}#{"; set #{env} at boot" unless env.empty?}", @log)
        else
          @starved_at = nil
          Counters.recovered
        end
      end

      def gave_up?(reading)
        return false unless @starved_at
        return true if capacity(reading) <= @starved_at

        @starved_at = nil
        Counters.recovered
        false
      end

      def capacity(reading)
        stat = reading.fetch(:stat)
        stat.fetch(:heap_available_slots) + stat.fetch(:heap_allocatable_slots, 0) +
          (stat.fetch(:heap_allocatable_pages, 0) * GC::INTERNAL_CONSTANTS.fetch(:HEAP_PAGE_OBJ_LIMIT, 409))
      end

      # Ruby 3.4+: no major GC of Ruby's own while serving (GC.config is
      # per process; set in each worker at its first unit of work).
      def full_mark_off
        return if @full_mark_off == Process.pid

        @full_mark_off = Process.pid
        GC.config(rgengc_allow_full_mark: false)
      end

      # The valve: a heap that grew past its bound gets Ruby's majors back.
      def valve(reading)
        return unless @policy.is_a?(Policy::NoFullMark) && @policy.valve?(reading)
        return if GC.config[:rgengc_allow_full_mark]

        GC.config(rgengc_allow_full_mark: true)
        Counters.give_up("the heap grew past twice its size at the last major GC with no idle moment to " \
                         "run one; Ruby's own major GCs are back on", @log)
      end
    end
  end
end
