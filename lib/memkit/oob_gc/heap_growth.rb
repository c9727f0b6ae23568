# frozen_string_literal: true

require_relative "../gc_rest"

module Memkit
  class OobGC
    # Grows Ruby's object heap at run time, where Ruby offers knobs for its
    # size only at boot (RUBY_GC_HEAP_*INIT_SLOTS).
    #
    # With GC disabled, an allocation that finds a pool full adds one page
    # to it instead of collecting (heap_ready_to_gc on 3.1 and 3.3). So this
    # allocates, under GC.disable, fillers for every free slot of the pool
    # and for the slots wanted, drops them all, and runs one minor GC: the
    # pool has the pages it wanted and no more, and its new pages are free.
    # Ruby's own growth, which the collector used to provoke by filling a
    # pool to the top and collecting, adds its growth factor's share of the
    # whole pool at a time (1.57x measured after such a fill): on the "huge"
    # shape on Ruby 3.1 a worker that needed 13 MB of pages grew 28-31 MB,
    # 1.26-1.32x the RSS of no OobGC (docs/BENCHMARKS.md, "Heap growth by
    # the page").
    #
    # What Ruby does next (bench/oobgc_grow_probe.rb on 3.1, 3.3 and 3.4): a
    # later GC that finds more than 65% of the heap free
    # (GC_HEAP_FREE_SLOTS_MAX_RATIO) gives empty pages back, down to that
    # share, but never below RUBY_GC_HEAP_INIT_SLOTS. So a heap grown to more
    # than ~2.9 times its live objects shrinks again; the collector grows it
    # again only after `regrow_after` requests, and boot_env tells the user
    # the INIT_SLOTS that keeps it.
    #
    # Ruby 3.4 grows by running a pool dry instead (DryGrowth): its pools
    # take pages from one shared count, which a minor GC that leaves the
    # heap mostly free takes back.
    class HeapGrowth
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

      # want: slots to add per pool, within the budget, at most `share` of
      # what is left of it; need: slots each pool must gain whatever the
      # budget (a heap that cannot hold the next requests gains nothing from
      # collecting early); order: the pools to grow first while the budget
      # lasts (the one that runs dry soonest decides how often GC runs).
      # Returns the bytes of object pages added, or nil if there was nothing
      # to add (no GC run).
      def grow(want, policy, need: [], share: 1.0, order: want.each_index)
        GCRest.finish
        before = page_bytes
        free = policy.free(Collector.reading)
        ran = false
        order.each do |i|
          left = budget - [page_bytes - before, 0].max
          slots = [want.fetch(i), (left * share / slot_size(i)).floor].min
          slots = [slots, need.fetch(i, 0)].max
          next unless slots.positive?

          allocate(i, free.fetch(i) + slots)
          ran = true
        end
        return unless ran

        # The fillers are young: a minor frees them.
        collect(minor: true)
        added = [page_bytes - before, 0].max
        @grown_bytes += added
        added
      end

      # Bytes of the object pages the heap holds now, and of those Ruby has
      # decided to add as allocation needs them (what it costs in RSS).
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

      def page_bytes = self.class.page_bytes

      # A minor becomes a major where Ruby has one pending.
      def collect(minor:)
        GC.start(full_mark: !(minor && MINOR_GROWS), immediate_sweep: true)
        @major_at = GC.count if GC.latest_gc_info(:major_by)
      end

      def pools? = @pools

      def slot_size(index)
        pools? ? GC.stat_heap(index, :slot_size) : GC::INTERNAL_CONSTANTS.fetch(:RVALUE_SIZE, 40)
      end

      # `count` fillers of pool `index`, dropped as they come, with GC
      # disabled: past the pool's free slots and the pages Ruby may add, each
      # page they need is added to the pool (see above). Nothing else may
      # allocate here (a GC.stat Hash per object would land in another pool).
      def allocate(index, count)
        length = pools? ? self.class.filler_length(index) : nil
        disabled = GC.disable
        begin
          if length
            count.times { Array.new(length) }
          else
            count.times { Object.new }
          end
        ensure
          GC.enable unless disabled
        end
      end
    end
  end
end
