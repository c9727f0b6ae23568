# frozen_string_literal: true

require_relative "../gc_rest"

module Memkit
  class OobGC
    # Grows Ruby's object heap at run time, where Ruby offers knobs for its
    # size only at boot (RUBY_GC_HEAP_*INIT_SLOTS).
    #
    # Ruby grows a heap at the end of a GC that leaves less than 20% of it
    # free (gc_marks_finish on 3.1; the sweep's end on 3.3+, which also wants
    # the GC to have freed more slots than it found in empty pages). So this
    # fills the pool nearly to the top with objects it holds, and a seventh
    # it drops, spread among them, and runs a major GC: Ruby sees a heap about
    # 85% live with garbage in it and grows it by its growth factor (1.8).
    # It repeats until the pool has the slots wanted (or stops growing),
    # then drops the fillers and collects them.
    #
    # Within RVALUE_OLD_AGE (3) GCs of a major, Ruby grows a heap a minor GC
    # leaves short instead of asking for a major (gc_marks_finish on 3.1,
    # gc_sweep_finish_size_pool on 3.3), and fillers that have survived
    # fewer GCs than that are still young: so the rounds there, and the GC
    # that frees the fillers, are minors, which mark the fillers but not the
    # old heap. On the "cache" shape (a million old objects, Ruby 3.3) a
    # growth of majors, run mid-sweep (see #grow), held a Puma worker for
    # 400-800 ms, and the requests queued behind it set the p99
    # (docs/BENCHMARKS.md, "Heap growth on a finished sweep").
    #
    # What Ruby does next (verified with bench/oobgc_grow_probe.rb on 3.1,
    # 3.3 and 3.4): a later GC that finds more than 65% of the heap free
    # (GC_HEAP_FREE_SLOTS_MAX_RATIO) gives empty pages back, down to that
    # share, but never below RUBY_GC_HEAP_INIT_SLOTS. So a heap grown to more
    # than ~2.9 times its live objects shrinks again; the collector grows it
    # again only after `regrow_after` requests, and boot_env tells the user
    # the INIT_SLOTS that keeps it.
    class HeapGrowth
      TOP = 0.99
      # What one round adds, as a share of the pool: Ruby's heap_extend_pages
      # grows to live / (1 - goal ratio 0.4), capped at the growth factor;
      # measured after the fill, 1.57x on 3.1 and 3.3 (a million-object heap).
      # Checked against a smaller step (0.45), the bound let a 3.1 Puma
      # worker of the "large" shape grow 24 MB of pages: 1.36x the RSS of no
      # OobGC.
      STEP = 0.6
      ROUNDS = 6
      OLD_AGE = 3
      # Where the slots a growth adds are a count shared by the pools
      # (GC.stat's heap_allocatable_slots, Ruby 3.4), a minor GC that leaves
      # the heap mostly free takes them back; only majors keep them.
      MINOR_GROWS = !GC.stat.key?(:heap_allocatable_slots)

      attr_reader :grown_bytes

      def initialize(max_bytes:)
        @max_bytes = max_bytes
        @grown_bytes = 0
        @pools = GC.respond_to?(:stat_heap) && GC.stat_heap(0).key?(:total_allocated_objects)
      end

      def budget = [[@max_bytes, @allowed || @max_bytes].min - @grown_bytes, 0].max

      # Counts `bytes` the heap grew by other means against the budget.
      def record(bytes)
        @grown_bytes += bytes
      end

      # The length of an Array that fills one slot of pool `index` (embedded:
      # 16 bytes of header and 8 per element, checked on 3.3 and 3.4).
      def self.filler_length(index)
        [(GC.stat_heap(index, :slot_size) - 16) / 8, 0].max
      end

      # Allows `bytes` more from now on, within max_bytes (see RssBudget).
      def allow(bytes)
        @allowed = @grown_bytes + [bytes, 0].max
      end

      # This process's resident set, in bytes (nil where /proc is missing).
      def self.rss
        Memkit.rss
      rescue Memkit::Error
        nil
      end

      # want: slots to add per pool; rounds: at most this many of Ruby's
      # growth steps per pool; one_past: the first step may pass the budget
      # (a heap that cannot hold the next requests gains nothing from
      # collecting early, so one step is worth more than the bound); pages:
      # where Ruby's first step would pass the budget, add what the budget
      # allows page by page instead (#page); order: the pools to grow first,
      # while the budget lasts (the one that runs dry soonest decides how
      # often GC runs). Returns the bytes of object pages added (0 if Ruby
      # would not grow), or nil if no step fit the budget (no GC run).
      def grow(want, policy, rounds: ROUNDS, one_past: false, pages: false, order: want.each_index)
        # Mid-sweep, the unswept garbage counts both as live and as free
        # (Policy#free reads the mark): the fill overran the pool and
        # started GCs of Ruby's own, a major among them.
        GCRest.finish
        @major_at = GC.count if GC.latest_gc_info(:major_by)
        before = footprint
        held = []
        ran = 0
        order.each do |i|
          slots = want.fetch(i)
          next unless slots.positive?

          slots = [slots, budget / slot_size(i)].min
          next unless slots.positive?

          goal = capacity(policy, i) + slots
          rounds.times do |round|
            now = capacity(policy, i)
            break if now >= goal
            # Ruby grows a pool by a step of its own (about 1.4x at the
            # fill's live share): none that would pass the bound.
            past = now * STEP * slot_size(i) > budget - cost(before)
            if past && !(one_past && round.zero? && ran.zero?)
              # Less than a page is not worth the fill and the GC.
              ran += page(policy, i, goal - now) if pages && round.zero? && goal - now >= page_slots(i)
              break
            end

            fill(i, now, held)
            collect(minor: @major_at && GC.count + 1 - @major_at < OLD_AGE)
            ran += 1
            grew = grew?(policy, i, now)
            # 3.3 grows a pool at a minor only once its allocatable pages are
            # spent; where the fill left some, a major grows it.
            if !grew && last_kind == :minor
              collect(minor: false)
              ran += 1
              grew = grew?(policy, i, now)
            end
            break unless grew
          end
        end
        # No round fit the budget: nothing to drop, no major to run.
        return if ran.zero?

        held.clear
        collect(minor: ran < OLD_AGE)
        added = cost(before)
        @grown_bytes += added
        added
      end

      # Bytes of the object pages the heap holds now, and of those Ruby has
      # decided to add as allocation needs them (what it costs in RSS; 3.4's
      # shared allowance counted as 40-byte slots, its least).
      def self.page_bytes
        stat = GC.stat
        pages = stat.fetch(:heap_eden_pages) + stat.fetch(:heap_allocatable_pages, 0)
        shared = stat.fetch(:heap_allocatable_slots, 0) * GC::INTERNAL_CONSTANTS.fetch(:BASE_SLOT_SIZE, 40)
        (pages * page_size) + shared
      end

      # Bytes of the object pages the heap holds now.
      def self.eden_bytes = GC.stat(:heap_eden_pages) * page_size

      def self.page_size
        GC::INTERNAL_CONSTANTS.fetch(:HEAP_PAGE_SIZE) do
          GC::INTERNAL_CONSTANTS.fetch(:HEAP_PAGE_OBJ_LIMIT, 409) * GC::INTERNAL_CONSTANTS.fetch(:RVALUE_SIZE, 40)
        end
      end

      # The kind of the last GC #grow ran: :major or :minor.
      def last_kind = @major_at == GC.count ? :major : :minor

      private

      # The object pages held and those Ruby allows, in bytes.
      def footprint
        eden = self.class.eden_bytes
        [eden, self.class.page_bytes - eden]
      end

      # What the heap has grown by since `before` (#footprint): the pages it
      # holds beyond those it held, and the allowance beyond the one Ruby had
      # granted. The fill takes a pool's allowance first. Counted as pages
      # held plus allowed, the pages Ruby had allowed at an earlier GC cost
      # nothing once filled, or less than nothing where Ruby then allowed
      # fewer: a heap grown for a million objects and then mostly free
      # counted 0 bytes for a 19-20 MB rise in its pages, on 3.1 and 3.3.
      def cost(before)
        eden, allowed = before
        now_eden, now_allowed = footprint
        [now_eden - eden + [now_allowed - allowed, 0].max, 0].max
      end

      # Ruby's smallest growth step is 1.1x; a pool's capacity moves by a
      # few slots between readings without one (pages of unequal slots).
      def grew?(policy, index, before) = capacity(policy, index) > before * 1.05

      # A minor becomes a major where Ruby has one pending.
      def collect(minor:)
        GC.start(full_mark: !(minor && MINOR_GROWS), immediate_sweep: true)
        @major_at = GC.count if GC.latest_gc_info(:major_by)
      end

      def pools? = @pools

      def slot_size(index)
        pools? ? GC.stat_heap(index, :slot_size) : GC::INTERNAL_CONSTANTS.fetch(:RVALUE_SIZE, 40)
      end

      def live(index)
        if pools?
          h = GC.stat_heap(index)
          h[:total_allocated_objects] - h[:total_freed_objects]
        else
          GC.stat(:heap_live_slots)
        end
      end

      def capacity(policy, index)
        policy.free(Collector.reading)[index] + live(index)
      end

      # Allocates objects until the pool is TOP full, holding them but one in
      # seven: the pool ends about 85% full of live objects, with the dead
      # ones spread over the same pages. Ruby 3.4 grows a pool only if its
      # sweep freed more slots than it found in wholly empty pages, so the
      # garbage must not fill pages of its own. Nothing else may allocate
      # here (a GC.stat Hash per object would fill another pool).
      def fill(index, capacity, held)
        length = pools? ? self.class.filler_length(index) : nil
        count = (capacity * TOP).to_i - live(index)
        return unless count.positive?

        batch = []
        count.times do |i|
          object = filler(length)
          batch << object unless (i % 7).zero?
        end
        held << batch
        nil
      end

      # Adds pages for `slots` more to pool `index`, full of fillers the GC
      # that ends #grow frees. With GC disabled, an allocation that finds
      # the pool full adds one page to it instead of collecting
      # (heap_ready_to_gc in gc.c, 3.1-3.4), so the heap grows by the pages
      # asked for, not by Ruby's step (1.57x the pool at a time): a worker
      # whose step passed the budget did not grow at all, and with requests
      # of 240k objects one in 20 (the "mixed" shape, Ruby 3.1) ran a GC
      # every six requests, 1.8-3.2x Ruby alone's (docs/BENCHMARKS.md).
      # Returns the rounds run (1).
      def page(policy, index, slots)
        length = pools? ? self.class.filler_length(index) : nil
        count = policy.free(Collector.reading)[index] + slots
        disabled = GC.disable
        begin
          count.times { filler(length) }
        ensure
          GC.enable unless disabled
        end
        1
      end

      def page_slots(index) = self.class.page_size / slot_size(index)

      # An object that lands in the pool (see .filler_length).
      def filler(length)
        length ? Array.new(length) : Object.new
      end
    end
  end
end
