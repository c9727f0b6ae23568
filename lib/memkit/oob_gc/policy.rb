# frozen_string_literal: true

module Memkit
  class OobGC
    # When to collect between requests, from a reading of the heap and the
    # learned request Profile. Pure: a reading is a Hash of plain values
    #
    #   { stat: GC.stat, heaps: [GC.stat_heap(i), ...] or nil, info: GC.latest_gc_info }
    #
    # so tests can feed made-up sequences. One subclass per GC model, chosen
    # once by Policy.detect from what the running Ruby offers.
    #
    # #decide answers :minor, :major or nil: the GC the next request (with
    # `headroom` requests' worth to spare) would otherwise start inside
    # itself. #shortfall answers how many slots per pool the heap lacks, after
    # a GC, to hold the next `cover` requests; the collector grows the heap by
    # that much where it can.
    class Policy
      # Ruby's GC_HEAP_FREE_SLOTS_MIN_RATIO default: a GC that leaves less of
      # the heap free than this makes the next GC a major (or grows the heap).
      MIN_FREE_RATIO = 0.20

      def self.detect(gc = GC)
        if gc.respond_to?(:stat_heap) && gc.stat_heap(0).key?(:total_allocated_objects)
          gc.respond_to?(:config) && gc.config.key?(:rgengc_allow_full_mark) ? NoFullMark : SizePools
        else
          OneHeap
        end
      end

      attr_reader :headroom

      def initialize(headroom: 1.25, min_free_ratio: MIN_FREE_RATIO)
        @headroom = headroom.to_f
        @min_free_ratio = min_free_ratio.to_f
      end

      def name = self.class.name.split("::").last

      # Whether this model sweeps lazily after an out-of-band GC (see OneHeap).
      def lazy_sweep? = false

      # Called with each reading taken after a request; `allocated_before`
      # is total_allocated_objects when that request started.
      def observe(_reading, allocated_before: nil); end

      # Called with the reading right after a GC this process ran.
      def collected(_kind, _reading); end

      def decide(reading, profile, headroom: @headroom)
        return if profile.empty?

        short = pools_short?(reading, profile.objects, headroom) || malloc_short?(reading, profile.malloc, headroom)
        return unless short

        major_pending?(reading) || minor_would_fill?(reading) ? :major : :minor
      end

      # Slots each pool lacks, as the heap stands, to hold `cover` requests.
      def shortfall(reading, profile, cover:)
        free(reading).each_with_index.map do |f, i|
          want = (profile.objects.fetch(i, 0) * cover).ceil
          want > f ? want - f : 0
        end
      end

      # Whether the next request cannot fit even in a heap just collected.
      def starved?(reading, profile)
        free(reading).each_with_index.any? { |f, i| f < profile.objects.fetch(i, 0) }
      end

      # After a minor GC: whether Ruby has made the next GC a major one.
      def major_next?(reading)
        !reading.fetch(:info)[:need_major_by].nil?
      end

      # Free slots per pool, counting the pages Ruby may still add without
      # collecting first.
      def free(reading) = raise(NotImplementedError)

      # Whether Ruby has decided the next GC will be major, so the
      # out-of-band one must be too.
      def major_pending?(reading)
        return true if reading.fetch(:info)[:need_major_by]

        stat = reading.fetch(:stat)
        return true if stat.fetch(:old_objects) >= stat.fetch(:old_objects_limit)

        limit = stat.fetch(:remembered_wb_unprotected_objects_limit, 0)
        return true if limit.positive? && stat.fetch(:remembered_wb_unprotected_objects) >= limit

        # Ruby compares oldmalloc with its limit only when a GC starts (it
        # never starts one for oldmalloc alone). Running the major before the
        # limit is crossed would hide the overrun from Ruby, which then
        # shrinks the limit, and majors come ever more often.
        stat.fetch(:oldmalloc_increase_bytes) > stat.fetch(:oldmalloc_increase_bytes_limit)
      end

      def minor_would_fill?(_reading) = false

      # Told the heap as it stands just before this process collects.
      def collecting(_reading); end

      private

      def pools_short?(reading, objects, headroom)
        free(reading).each_with_index.any? { |f, i| f < objects.fetch(i, 0) * headroom }
      end

      def malloc_short?(reading, malloc, headroom)
        stat = reading.fetch(:stat)
        stat.fetch(:malloc_increase_bytes) + (malloc * headroom) > stat.fetch(:malloc_increase_bytes_limit)
      end
    end
  end
end

require_relative "policy/one_heap"
require_relative "policy/size_pools"
require_relative "policy/no_full_mark"
