# frozen_string_literal: true

module Memkit
  class OobGC
    class Policy
      # One object heap (Ruby 3.1). The out-of-band GC leaves the sweep to the
      # next allocations, as Ruby does: only the mark must run in one piece,
      # and sweeping lazily spreads the rest over the next requests. While a
      # sweep is under way heap_free_slots counts only the pages swept so far,
      # and Ruby starts no GC before the sweep has reached the last page; what
      # will be free then is what the mark left unmarked, less what has been
      # allocated since.
      class OneHeap < Policy
        # Ruby's RVALUE_OLD_AGE: within this many GCs of a major, a minor GC
        # that leaves the heap short grows it instead of asking for a major.
        OLD_AGE = 3

        def initialize(page_slots: GC::INTERNAL_CONSTANTS.fetch(:HEAP_PAGE_OBJ_LIMIT, 409), **options)
          super(**options)
          @page_slots = page_slots
          @seen = nil      # [count, total_allocated_objects, major_gc_count] at the last reading
          @marked_at = nil # total_allocated_objects when the latest mark ended (or before), once seen
          @major_at = nil  # GC count at the latest major seen
          @survived = nil  # young objects the latest out-of-band minor kept
        end

        def lazy_sweep?(_reading) = true
        def reads_sweep?(_reading, _kind, _apart) = true

        # A GC has run since the last look if the count moved; its mark ended
        # after the allocations counted then (the figure errs towards less
        # free), and if it was a major, at about the count seen now.
        def observe(reading, allocated_before: nil)
          stat = reading.fetch(:stat)
          count = stat.fetch(:count)
          if @seen && count != @seen[0]
            @marked_at = allocated_before && allocated_before > @seen[1] ? allocated_before : @seen[1]
            @major_at = count if stat.fetch(:major_gc_count) != @seen[2]
          end
          @seen = [count, stat.fetch(:total_allocated_objects), stat.fetch(:major_gc_count)]
        end

        def collected(kind, reading)
          super
          stat = reading.fetch(:stat)
          @survived = stat.fetch(:heap_marked_slots) - @old_before if kind == :minor && @old_before
          @marked_at = stat.fetch(:total_allocated_objects)
          @major_at = stat.fetch(:count) if kind == :major
          @seen = [stat.fetch(:count), @marked_at, stat.fetch(:major_gc_count)]
        end

        def init_slots_env(reading, objects, cover)
          own = reading.fetch(:stat).fetch(:heap_available_slots)
          want = [live(reading) + (objects.fetch(0, 0) * cover).ceil, own].max
          { "RUBY_GC_HEAP_INIT_SLOTS" => round_up(want, @page_slots) }
        end

        # Mid-sweep, what the mark kept.
        def live(reading)
          stat = reading.fetch(:stat)
          reading.fetch(:info)[:state] == :sweeping ? stat.fetch(:heap_marked_slots) : stat.fetch(:heap_live_slots)
        end

        # With a major pending, the allocatable pages are not room: Ruby
        # takes none while one is (heap_prepare starts the GC as soon as the
        # eden pages are full), so the major is due when they are, and runs
        # between requests where Ruby would have run it inside the next one.
        def free(reading)
          stat = reading.fetch(:stat)
          free = if @marked_at && reading.fetch(:info)[:state] == :sweeping
                   since = stat.fetch(:total_allocated_objects) - @marked_at
                   eden_slots(stat) - stat.fetch(:heap_marked_slots) - since
                 else
                   stat.fetch(:heap_free_slots)
                 end
          [major_pending?(reading) ? free : free + allocatable_slots(stat)]
        end

        # Ruby 3.1 says nothing about the next GC being major (no
        # latest_gc_info(:need_major_by)). Its mark sets the flag when old or
        # remembered shady objects pass their limits, which #major_pending?
        # reads from GC.stat; that major runs at once. Left for when the eden
        # pages would be full (#free, #major_due?), it started inside a
        # request in 59 of 60 cases on the bench Rails app behind Puma
        # (docs/BENCHMARKS.md, "OobGC on the Rails app"). And when the sweep will leave too
        # little free (NOFREE, gc_marks_finish), applied here: the slots the
        # sweep will leave free against the heap with the pages it may add.
        def major_next?(reading)
          return true if super || major_pending?(reading)

          stat = reading.fetch(:stat)
          !grows_instead?(stat.fetch(:count)) && fills?(stat, stat.fetch(:heap_marked_slots))
        end

        # If a minor would leave less than Ruby's free minimum, or its mark
        # would take old or shady objects past their limits (each grows by
        # about what it grew at the last out-of-band minor), the major would
        # follow it at once, and the minor is only work added to the same
        # pause: on the bench Rails app behind Puma that was one GC run more
        # per major (1.13x Ruby alone's GC runs).
        def minor_would_fill?(reading)
          return false unless @survived

          stat = reading.fetch(:stat)
          return true if flags_would_pass?(stat)

          !grows_instead?(stat.fetch(:count) + 1) && fills?(stat, stat.fetch(:old_objects) + @survived)
        end

        private

        def fills?(stat, marked)
          total = eden_slots(stat) + allocatable_slots(stat)
          total - marked < total * @min_free_ratio
        end

        def grows_instead?(count)
          @major_at && count - @major_at < OLD_AGE
        end

        # Slots on the eden pages. Not pages times HEAP_PAGE_OBJ_LIMIT: a page
        # holds 408 or 409 slots as its body's alignment falls, and on the
        # "tiny" bench shape (3,280 pages) that counted 1,312 slots that were
        # not there, so the estimate mid-sweep (#free) said a request fit
        # where Ruby then collected inside it. Tomb pages (empty, waiting to
        # be freed) are in heap_available_slots too; taken at the most a page
        # holds, so the figure errs low.
        def eden_slots(stat) = stat.fetch(:heap_available_slots) - (stat.fetch(:heap_tomb_pages) * @page_slots)
        def allocatable_slots(stat) = stat.fetch(:heap_allocatable_pages, 0) * @page_slots
      end
    end
  end
end
