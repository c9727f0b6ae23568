# frozen_string_literal: true

require_relative "../gc_rest"

module Memkit
  class OobGC
    # Ruby 3.4+ with full marks off (Policy::NoFullMark): the heap grows
    # only at a GC that allocation started (heap_prepare), as pages any pool
    # may take, and a major grows a pool only if its sweep freed more than it
    # found free, which a major run right after a minor never does. A heap
    # collected only by GC.start between requests never grew, and a pool
    # swept to under 20% free asked for a `:nofree` major every third minor.
    #
    # So after a GC that left pools short (#plan), the next minor GC due runs
    # as Ruby's own (#run_due_minor): garbage is allocated in the pool the
    # policy chose until it is dry and Ruby collects and allows the heap more
    # pages. No GC is added: it is the GC that was due. The pools then take
    # those pages by the policy's plan (#take_plan), at once as far as
    # FILL_SLOTS goes, the rest as their requests need them or just before
    # the next minor GC (#take_left); once they have taken the plan's bytes,
    # a minor GC takes back what Ruby allowed beyond it (#spent). A pool
    # below its initial slots grows with no GC at all (#grow_freely).
    # Everything added counts against `growth`, the collector's budget.
    class DryGrowth
      # After a growth that left pools to take their pages (#take_plan): the
      # GC that allowed the pages, the eden bytes past which the rest is taken
      # back (#spent), and the slots per pool left to take as of `eden`, the
      # pools' slots then (#take_left).
      Pending = Struct.new(:count, :limit, :left, :eden)

      # Slots allocated beyond the pool's free count before #run_dry stops
      # waiting for Ruby to collect (GC.disable'd, or a count that was off).
      RUN_DRY_MARGIN = 10_000

      # Slots one growth fills at most (#take_plan): about 20 ms at the 0.1 us
      # a filler costs, a minor GC's pause on the "large" shape.
      FILL_SLOTS = 200_000

      def initialize(policy:, growth:)
        @policy = policy
        @growth = growth
        @pool = nil # the pool to run dry at the next minor GC due, and
        @plan = nil # the slots each pool takes of the pages Ruby allows then
        @pending = nil # a Pending while pools still have pages to take
        @dry_base = nil # eden bytes before the first growth
        @dried_at = nil # GC.count after the last growth
        @dried = false # whether #run_due_minor ran a GC #take_dried has not followed up
        @largest = Policy::SizePools::BASE_SLOT_SIZE # the largest slot a request allocates in
      end

      # After a GC (`reading`): counts what the last growth added, grows
      # small pools freely, and plans the next growth, for the heap to hold
      # `cover` requests and, past a worker's first requests, `want`. One
      # growth at a time: what the last one added is known only once a GC
      # has run since (the pages come as requests allocate).
      def plan(reading, profile, cover:, want:)
        count_dried
        sizes = reading.fetch(:heaps).each_with_index.filter_map do |h, i|
          h.fetch(:slot_size) if profile.objects.fetch(i, 0).positive?
        end
        @largest = sizes.max || Policy::SizePools::BASE_SLOT_SIZE
        # Half the budget left may go to levelling the pools (Policy#balance),
        # at each growth: the rest stays for pools that run short later.
        short = @policy.growth_shortfall(reading, profile, cover: cover, want: want, spare: @growth.budget / 2)
        short = grow_freely(reading, short)
        @pool = @plan = nil
        return unless @dried_at.nil? || GC.count > @dried_at

        @pool, @plan = @policy.grow_by_allocation(reading, short, profile, budget: @growth.budget, cover: cover)
      end

      # Runs the minor GC due as Ruby's own where a growth is planned
      # (#run_dry). Returns whether Ruby collected; if not, the caller
      # collects. Either way the caller then tells the policy of the GC and
      # calls #take_dried.
      #
      # Also where Ruby has a major pending that the policy turned down
      # (Policy::NoFullMark#turned_down?): GC.start turns full marks back on
      # while it runs (rb_gc_impl_start), so it would run that major; on the
      # "cache" shape (3.4, Puma) 6-7 majors per worker in 8 seconds, where
      # the policy had turned each down. That minor runs dry the pool that
      # holds the fewest requests, the one Ruby would have found empty in the
      # next request, and leaves the pages Ruby then allows as they are, as
      # that GC would have: taken back by a second minor, the pools stayed
      # under Ruby's free minimum and the next cycle asked for the major
      # again, two GCs a cycle (111 per worker where Ruby's own ran 52).
      def run_due_minor(reading, profile)
        pool = @pool
        @pool = nil
        return @dried = run_dry(pool, reading) if pool

        @dried = false
        pool = @policy.runs_out_first(reading, profile) if @policy.turned_down?(reading)
        pool ? run_dry(pool, reading) : false
      end

      # After the GC #run_due_minor ran, once the policy has seen the heap as
      # that GC left it (Policy#collected): the pools take the pages Ruby
      # allowed (#take_plan). The fillers that takes are garbage at the next
      # GC, and the policy counts what was allocated since it last saw the
      # heap as the garbage of a lazy sweep. Filled before, they counted as
      # live: the pool filled looked short again after the next GC and was
      # grown again, every other GC. On the "cache" shape (3.4) the 80-byte
      # pool went from 119k slots to 272k in 260 requests, half of them free
      # after each GC, while the pools that ran out first were not grown.
      def take_dried(profile)
        return unless @dried

        @dried = false
        before = HeapGrowth.eden_bytes
        left = take_plan(@plan)
        budget = @growth.budget - (HeapGrowth.eden_bytes - before)
        spend = [left.each_with_index.sum { |slots, i| slots * GC.stat_heap(i, :slot_size) }, budget].min
        if spend.positive?
          @pending = Pending.new(GC.count, HeapGrowth.eden_bytes + spend, left, Collector.eden_slots)
        else
          drop_allowance(budget) || free_fillers(profile)
        end
        @dried_at = GC.count
        Counters.grew(0)
        nil
      end

      # After each unit of work, where #take_plan left pools to grow: once
      # the heap has gained the plan's bytes since the GC that allowed the
      # pages, a minor GC that allocation did not start takes the rest back
      # (#drop_allowance). Every pool counts the pages allowed as free, and
      # the first to run out takes them: left alone, the main pool of the
      # "large" shape took all 18-28 MB Ruby allowed, the heap grew 72 MB
      # where the bound was 64, RSS 1.34x no OobGC. `apart`: units of work
      # since the last GC; far enough apart, that GC leaves its sweep to the
      # requests (Policy#reads_sweep?), as an out-of-band minor does: swept at
      # once, it held the next request 16-18 ms on the "tiny" shape (3.4, one
      # process), once per growth. Returns whether it ran that GC.
      def spent(apart)
        return false unless @pending

        @pending = nil unless @pending.count == GC.count
        return false unless @pending && HeapGrowth.eden_bytes >= @pending.limit

        @pending = nil
        drop_allowance(0, apart: apart)
      end

      # A minor GC is due while pools #take_plan left out have not taken
      # their slots of the pages Ruby allowed: their free slots are fewest
      # now, so they take them now, as far as FILL_SLOTS goes. Returns
      # whether any did. On the "large" shape (3.4) a GC due for another
      # pool came first, and took the pages back, often enough for 1.12x
      # Ruby alone's GC runs in one process (1.00x with this).
      def take_left
        pending = @pending
        return false unless pending&.count == GC.count

        now = Collector.eden_slots
        left = pending.left.each_index.map { |i| [pending.left[i] - (now[i] - pending.eden[i]), 0].max }
        rest = take_plan(left)
        return false if rest == left

        pending.left = rest
        pending.eden = Collector.eden_slots
        true
      end

      private

      # Runs the due minor GC as Ruby's own: allocates garbage in `pool`
      # until the pool is dry and Ruby collects, which then grows the heap
      # (see Policy::NoFullMark#grow_by_allocation). Ruby sweeps that GC
      # lazily; GC.disable finishes the sweep (the policies read free slots
      # from a finished sweep). Returns false, with nothing collected, if Ruby
      # did not collect within the pool's free slots and a margin.
      def run_dry(pool, reading)
        # GC turned off by the app: no GC would come (GC.start then runs none either).
        return false if GC.disable

        GC.enable
        @dry_base ||= HeapGrowth.eden_bytes
        count = GC.count
        # The slots a major pending keeps back count: the estimate of them errs high.
        limit = @policy.free(reading).fetch(pool) + @policy.kept_back(reading).fetch(pool, 0) + RUN_DRY_MARGIN
        length = HeapGrowth.filler_length(pool)
        allocated = 0
        begin
          while GC.count == count
            return false if allocated > limit

            Array.new(length)
            allocated += 1
          end
        ensure
          @policy.allocated_aside(allocated)
        end
        GCRest.finish
        true
      end

      # A pool below its initial slots takes new pages with no GC (Ruby
      # 3.4): filling its free slots and `slots` more, with objects dropped
      # at once, adds `slots` slots of pages. The next GC frees the objects;
      # the pool keeps the pages (Ruby frees none below its initial slots).
      # Returns `short` less the pools grown so.
      def grow_freely(reading, short)
        short.each_with_index.map do |slots, i|
          next slots unless slots.positive? && @policy.grows_freely?(reading, i, slots)

          h = reading.fetch(:heaps).fetch(i)
          next slots if slots * h.fetch(:slot_size) > @growth.budget

          @dry_base ||= HeapGrowth.eden_bytes
          fill_past(i, slots)
          Counters.grew(0)
          0
        end
      end

      # Has each pool take its slots of the plan (#take_pages), cheapest
      # first, while the slots filled stay within FILL_SLOTS. Returns the
      # slots per pool left to take (#spent, #take_left). A pool takes
      # new pages only once its free slots are used, so the fillers fill
      # those first: right after a GC the main pool of the "large" shape
      # (3.4) held most of ten requests free, and filling it then held
      # Puma's next request 60-140 ms (p99 6-10x no OobGC at 60% load).
      def take_plan(plan)
        cost = plan.each_index.map { |i| free_slots(i) + plan[i] if plan[i].positive? }
        left = plan.dup
        budget = FILL_SLOTS
        cost.each_index.select { |i| cost[i] }.sort_by { |i| cost[i] }.each do |i|
          break if cost[i] > budget

          budget -= cost[i]
          take_pages(i, plan[i])
          left[i] = 0
        end
        left
      end

      # Has pool `index` take up to `slots` slots of the pages Ruby now
      # allows (heap_allocatable_slots) within the growth budget, at once:
      # its free slots and those, filled with objects dropped at once, which
      # the next GC frees while the pool keeps the pages. Left to the
      # requests, the pages come only once a request has used the pool's free
      # slots, and a GC started by GC.start before then takes the allowance
      # back: on the "malloc" shape (8 MB malloc'd a request, a GC every few
      # of them) the pool never grew and asked for a `:nofree` major every
      # fourth request.
      def take_pages(index, slots)
        return unless slots.positive?

        size = GC.stat_heap(index, :slot_size)
        # A page short of all Ruby allows: one filler past it, and the pool
        # runs dry inside the fill, a GC of Ruby's (see #free_fillers).
        allowable = GC.stat(:heap_allocatable_slots) - (HeapGrowth.page_size / size)
        allowed = [slots, allowable, @growth.budget / size].min
        fill_past(index, allowed) if allowed.positive?
      end

      # The pages Ruby allowed and #take_pages left go to whichever pool
      # runs out first during the next requests, all charged to the growth
      # budget: on the "large" shape 164,000 slots of the main pool, beyond
      # what the plan chose, spent the rest of the budget, and on Puma the
      # heap grew 80 MB (RSS 1.4x no OobGC) where the bound was 64. Ruby
      # counts them in slots of whichever pool takes a page (a 160-byte
      # pool's page uses up 409, a 40-byte pool's 1,638; 3.4.11), and the
      # pools #take_plan just filled run out first: so they are worth the
      # largest slot a request allocates in. Counted in 40-byte slots, they
      # stayed on the "tiny" shape (3.4): the 160-byte pool took 12 MB more
      # than the plan, and the main pool, which runs out first, grew less
      # than Ruby alone's (GC every 300 requests where Ruby's ran every 360).
      # Where they are more than the `budget` bytes left, a minor GC that
      # allocation did not start takes them back (and frees #take_pages'
      # fillers), and the policy is told of it. Not while Ruby asks for a
      # major: one the collector runs takes them back too, and where the
      # policy turns it down (Policy#declined?) they stay with the pools;
      # taken back there, the "cache" shape's pools ran short again, 17
      # growths per worker in 8 seconds where they grew 6 times (Ruby 3.4,
      # Puma). Returns whether it ran that GC.
      def drop_allowance(budget, apart: 0)
        allowed = GC.stat(:heap_allocatable_slots) * @largest
        return unless allowed > budget

        minor(apart)
      end

      # Where the pools #take_plan filled took all the pages Ruby allowed,
      # they hold only fillers until the next GC, and the next request's first
      # allocation there starts it. Started by allocation, with full marks
      # off, that GC grows the heap by Ruby's own goal (heap_prepare): on the
      # Rails bench app (3.4, Unicorn) a worker's main pool went from 230,879
      # slots to 317,669 in one request, and its RSS with it. So where the
      # policy finds the next request would not fit, that minor runs now.
      # Returns whether it ran.
      def free_fillers(profile)
        @policy.decide(Collector.reading, profile) && minor
      end

      # A minor GC that allocation did not start: it frees the fillers, and
      # Ruby takes back the pages it allowed that no pool took. Not while
      # Ruby asks for a major: GC.start would run that major (full marks
      # come back on while it runs). Swept lazily where the policy reads the
      # sweep (`apart` units of work after the last GC). Returns whether it
      # ran.
      def minor(apart = 0)
        return false if GC.latest_gc_info(:need_major_by)

        started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        GCRest.finish
        count = GC.count
        reading = Collector.reading
        lazy = @policy.reads_sweep?(reading, :minor, apart)
        @policy.collecting(reading, :minor)
        # The reading and the policy allocate (GC.stat's Hashes), in pools
        # the growth may have left at their last free slots: where that
        # started a GC of Ruby's own, the fillers are freed, and a second GC
        # right after would free next to nothing.
        return false unless GC.count == count

        GC.start(full_mark: false, immediate_sweep: !lazy)
        Counters.record(false, Process.clock_gettime(Process::CLOCK_MONOTONIC) - started)
        @policy.collected(:minor, Collector.reading)
        true
      end

      # Fills pool `index` past its free slots by `slots`, with objects
      # dropped at once: the pool takes `slots` slots of new pages, and the
      # next GC frees the objects. Mid-sweep the allocation would sweep pages
      # instead of adding them, so the sweep is finished first.
      def fill_past(index, slots)
        GCRest.finish
        objects = free_slots(index) + slots
        Array.new(objects) { Array.new(HeapGrowth.filler_length(index)) }
        @policy.allocated_aside(objects + 1)
        nil
      end

      # Pool `index`'s free slots, the sweep done.
      def free_slots(index)
        heap = GC.stat_heap(index)
        live = heap.fetch(:total_allocated_objects) - heap.fetch(:total_freed_objects)
        [heap.fetch(:heap_eden_slots) - live, 0].max
      end

      # The object pages the heap has gained since the first #run_dry, taken
      # as the heap grows (the pages Ruby allows after a GC come as requests
      # allocate), against the growth budget. Ruby's own growth since counts
      # too: the bound is on the heap.
      def count_dried
        return unless @dry_base

        added = HeapGrowth.eden_bytes - @dry_base - @growth.grown_bytes
        return unless added.positive?

        @growth.record(added)
        Counters.grew(added, runs: 0)
        # Growth the collector caused is not the valve's case.
        @policy.collected(:grown, Collector.reading)
      end

    end
  end
end
