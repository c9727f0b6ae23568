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
    # pages. No GC is added: it is the GC that was due. Those pages are shared
    # out (#share_out): each pool may take its share as it runs out of its own
    # slots (the policy counts the share as room, Policy::NoFullMark#share),
    # and takes what is left of it just before the next minor GC
    # (#take_left). No pool is filled at once: filled right after the GC, a
    # pool's free slots held garbage for the whole cycle, the next GC came
    # after half the requests, and on the Rails app (3.4) memkit ran 1.15x
    # the GC runs of Ruby alone at its heap (docs/BENCHMARKS.md). A pool
    # below its initial slots grows with no GC at all (#grow_freely).
    # Everything added counts against `growth`, the collector's budget, but
    # a growth may pass what is left of it by what the pools lack of Ruby's
    # own free goal (Policy::NoFullMark#goal_bytes), as Ruby alone would
    # grow them: held to the budget, the "cache" shape's heap, whose live
    # objects keep growing, ran 2.2-4.1x the GC runs of no OobGC.
    class DryGrowth
      # After a growth: the GC that allowed the pages, and the slots per pool
      # left to take as of `eden`, the pools' slots then (#take_left).
      Pending = Struct.new(:count, :left, :eden)

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
        @weights = nil # bytes a request allocates per pool, in the pools still short
        @goal = 0 # bytes the pools lack of Ruby's free goal (Policy::NoFullMark#goal_bytes)
        @dry_base = nil # eden bytes before the first growth
        @dried_at = nil # GC.count after the last growth
      end

      # After a GC (`reading`): counts what the last growth added, grows
      # small pools freely, and plans the next growth, for the heap to hold
      # `cover` requests and, past a worker's first requests, `want`. One
      # growth at a time: what the last one added is known only once a GC
      # has run since (the pages come as requests allocate).
      def plan(reading, profile, cover:, want:)
        count_dried
        short = grow_freely(reading, @policy.growth_shortfall(reading, profile, cover: cover, want: want))
        @weights = weights(reading, short, profile)
        settled = @dried_at.nil? || GC.count > @dried_at
        @goal = @growth.off? ? 0 : @policy.goal_bytes(reading, profile)
        return @pool = @plan = nil unless settled

        @pool, @plan = @policy.grow_by_allocation(reading, short, profile, budget: @growth.budget + @goal, cover: cover)
      end

      # Runs the minor GC due as Ruby's own where a growth is planned
      # (#run_dry). Returns whether Ruby collected; if not, the caller
      # collects.
      def run_due_minor(reading)
        pool = @pool
        @pool = nil
        pool ? run_dry(pool, reading) : false
      end

      # A minor GC is due while pools have not taken their shares of the
      # pages Ruby allowed: their free slots are fewest now, and the GC about
      # to run frees the fillers, so they take them now, as far as FILL_SLOTS
      # goes. Returns whether any did. On the "large" shape (3.4) a GC due
      # for another pool came first, and took the pages back, often enough
      # for 1.12x Ruby alone's GC runs in one process (1.00x with this).
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
        limit = @policy.free(reading).fetch(pool) + RUN_DRY_MARGIN
        length = HeapGrowth.filler_length(pool)
        allocated = 0
        while GC.count == count
          return false if allocated > limit

          Array.new(length)
          allocated += 1
        end
        GCRest.finish
        shares = share_out(@plan)
        @pending = Pending.new(GC.count, shares, Collector.eden_slots)
        @policy.share(@pending.count, shares, @pending.eden)
        @dried_at = GC.count
        Counters.grew(0)
        true
      end

      # The pages Ruby allowed at the dry GC (heap_allocatable_slots, counted
      # in slots of the smallest size), within the growth budget, as slots
      # per pool: the plan first, the rest among the pools still short in
      # proportion to the bytes a request allocates in each, so that each
      # gains as many requests' worth. Left to themselves, the pages went to
      # whichever pool ran out first: the two workers of the Rails app ended
      # with different pools short, and one worker's 40-byte pool grew from
      # 219,409 to 325,843 slots on a plan of one slot.
      def share_out(plan)
        sizes = plan.each_index.map { |i| GC.stat_heap(i, :slot_size) }
        allowed = [GC.stat(:heap_allocatable_slots) * Policy::SizePools::BASE_SLOT_SIZE, @growth.budget + @goal].min
        planned = plan.each_with_index.sum { |slots, i| slots * sizes[i] }
        return plan.map { |slots| (slots * allowed.fdiv(planned)).floor } if planned > allowed

        total = @weights.sum
        return plan if total.zero?

        rest = allowed - planned
        plan.each_with_index.map { |slots, i| slots + (rest * @weights.fetch(i, 0) / total / sizes[i]) }
      end

      # Bytes a request allocates in each pool `short` has short (0 in the
      # others), by which #share_out divides what the plan leaves.
      def weights(reading, short, profile)
        heaps = reading.fetch(:heaps)
        short.each_index.map do |i|
          next 0 unless short[i].positive?

          profile.objects.fetch(i, 0) * heaps.fetch(i).fetch(:slot_size, Policy::SizePools::BASE_SLOT_SIZE)
        end
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

      # Has each pool take its slots of `plan` (#take_pages), cheapest
      # first, while the slots filled stay within FILL_SLOTS. Returns the
      # slots per pool left to take. A pool takes new pages only once its
      # free slots are used, so the fillers fill those first: the main pool
      # of the "large" shape (3.4) held most of ten requests free right after
      # a GC, and filling it then held Puma's next request 60-140 ms (p99
      # 6-10x no OobGC at 60% load).
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
        # Ruby counts the pages it allows in slots of the smallest size.
        allowed = GC.stat(:heap_allocatable_slots) * Policy::SizePools::BASE_SLOT_SIZE / size
        allowed = [slots, allowed, @growth.budget / size].min
        fill_past(index, allowed) if allowed.positive?
      end

      # Fills pool `index` past its free slots by `slots`, with objects
      # dropped at once: the pool takes `slots` slots of new pages, and the
      # next GC frees the objects. Mid-sweep the allocation would sweep pages
      # instead of adding them, so the sweep is finished first.
      def fill_past(index, slots)
        GCRest.finish
        Array.new(free_slots(index) + slots) { Array.new(HeapGrowth.filler_length(index)) }
        nil
      end

      # Pool `index`'s free slots, the sweep done.
      def free_slots(index)
        heap = GC.stat_heap(index)
        [heap.fetch(:heap_eden_slots) - (heap.fetch(:total_allocated_objects) - heap.fetch(:total_freed_objects)), 0].max
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
