# frozen_string_literal: true

module Memkit
  class OobGC
    class Policy
      # Size pools (Ruby 3.2+): objects of each size live in their own heap,
      # and any one running dry starts a GC. There is no marked count per
      # pool, so the free count is only right once the sweep is over: the
      # out-of-band GC sweeps at once.
      class SizePools < Policy
        BASE_SLOT_SIZE = 40

        # Free slots per pool: the pool's slots less its live objects, plus
        # the pages it may still add without collecting (per pool up to 3.3;
        # 3.4 keeps one count of allocatable slots, in base-size slots, that
        # every pool draws from).
        def live(reading)
          reading.fetch(:heaps).sum { |h| h.fetch(:total_allocated_objects) - h.fetch(:total_freed_objects) }
        end

        def free(reading)
          shared = reading.fetch(:stat).fetch(:heap_allocatable_slots, 0)
          reading.fetch(:heaps).map do |h|
            live = h.fetch(:total_allocated_objects) - h.fetch(:total_freed_objects)
            slots = h.fetch(:heap_eden_slots)
            pages = h.fetch(:heap_eden_pages)
            per_page = pages.zero? ? 0 : slots / pages
            slot_size = h.fetch(:slot_size, BASE_SLOT_SIZE)
            slots - live + (h.fetch(:heap_allocatable_pages, 0) * per_page) + (shared * BASE_SLOT_SIZE / slot_size)
          end
        end
      end
    end
  end
end
