# frozen_string_literal: true

module Memkit
  class OobGC
    class Policy
      # Size pools (Ruby 3.2+): objects of each size live in their own heap,
      # and any one running dry starts a GC. There is no marked count per
      # pool, so mid-sweep the free count per pool comes from an estimate
      # (Sweep) that errs towards less free, and only for an out-of-band minor
      # that follows another GC of this process with no GC between.
      #
      # Ruby 3.2/3.3 decide at the end of each pool's sweep
      # (gc_sweep_finish_size_pool): a pool left with less than 20% of its
      # slots free and no allocatable pages grows if the last major is under
      # RVALUE_OLD_AGE GCs old, and otherwise asks for a major (NOFREE), but
      # only if it is a "growth heap": its sweep freed more slots than it
      # found already free. A GC that allocation started finds its pool
      # exhausted, so that pool always is one. An out-of-band GC runs while
      # the pool still holds the next request's room, which is then "already
      # free": Ruby neither grows the pool nor asks for the major, and old
      # garbage that only a major frees piles up in it, so the GCs come
      # closer together as a worker ages (docs/BENCHMARKS.md, "OobGC on the Rails app": the
      # Rails app's 160-byte pool on 3.3, one GC every ~2 requests). So after
      # an out-of-band minor this applies Ruby's test to the room the next
      # cycle can use (the free slots less the room kept for the next
      # request), and a pool that fails it makes the next GC a major.
      class SizePools < Policy
        BASE_SLOT_SIZE = 40
        # Ruby's RVALUE_OLD_AGE: within this many GCs of a major, a pool left
        # short grows instead of asking for a major.
        OLD_AGE = 3

        # What the sweep of an out-of-band minor will free in each pool, for
        # the GC `count`: `garbage` per pool, against the pools' `freed`
        # counts when it started. Ruby counts only the total the mark kept
        # (heap_marked_slots), so the garbage G = occupied - marked is split:
        # each pool's is taken as what it allocated since the last mark less
        # every object that survived of all the pools' (their allocation less
        # G), as if all survivors were in that pool. A pool's garbage can only
        # be more (older young objects die too), so free errs low, towards a
        # GC early rather than late.
        Sweep = Struct.new(:count, :garbage, :freed)

        def initialize(**options)
          super
          @marked = nil # [GC count, allocated per pool] right after the latest GC this process ran
          @before = nil # [GC count, allocated, freed per pool] as that GC started
          @sweep = nil
          @major_at = nil     # GC count at the latest major seen
          @live_at_major = nil # live objects per pool right after it (nil: not seen)
          @nofree_at = nil    # GC count at which a minor asked for a major (see #collected)
          @objects = nil      # the profile's objects per pool, at the last #decide
          @beyond = nil       # and its Profile#beyond
          @majors = nil       # major_gc_count at the last reading
        end

        # Free slots per pool: the pool's slots less its live objects, plus
        # the pages it may still add without collecting (per pool up to 3.3;
        # 3.4 keeps one count of allocatable slots that every pool draws
        # from, a page's slots at a time whatever their size: counted as
        # 40-byte slots, the share any pool is sure of).
        def live(reading) = lives(reading).sum

        # Per pool a request allocates in, the slots on the pages it has, in
        # whole pages of the pool's slots over its pages, rounded up (Ruby
        # packs 1,637 or 1,638 40-byte slots on a 64 KB page).
        def init_slots_env(reading, objects, cover)
          lives = lives(reading)
          env = {}
          reading.fetch(:heaps).each_with_index do |h, i|
            next unless objects.fetch(i, 0).positive?

            slots = h.fetch(:heap_eden_slots)
            pages = h.fetch(:heap_eden_pages)
            want = [lives[i] + (objects.fetch(i, 0) * cover).ceil, slots].max
            env["RUBY_GC_HEAP_#{i}_INIT_SLOTS"] = pages.positive? ? round_up(want, (slots + pages - 1) / pages) : want
          end
          env
        end

        def free(reading) = free_slots(reading)

        # Live objects per pool; mid-sweep, less the garbage the Sweep
        # estimate says is still to be swept (without one, the unswept
        # garbage counts as live).
        def lives(reading)
          sweep = sweep_of(reading)
          reading.fetch(:heaps).each_with_index.map do |h, i|
            occupied = h.fetch(:total_allocated_objects) - h.fetch(:total_freed_objects)
            next occupied unless sweep

            occupied - [sweep.garbage.fetch(i) - (h.fetch(:total_freed_objects) - sweep.freed.fetch(i)), 0].max
          end
        end

        def lazy_sweep?(reading) = !sweep_of(reading).nil?

        # Requests between GCs from which a minor sweeps lazily. Closer, the
        # next request sweeps most of the heap anyway, and lazily its pages
        # came back differently: "huge" on 3.3 (a GC every one or two
        # requests) ran 1.33x Ruby alone's GC runs swept lazily, 0.66x swept
        # at once.
        SPREAD = 10

        # A minor that follows this process's last GC with none between: what
        # each pool allocated since that mark is known (see Sweep).
        def reads_sweep?(reading, kind, apart)
          kind == :minor && apart >= SPREAD && !@marked.nil? && @marked[0] == reading.fetch(:stat).fetch(:count)
        end

        # Told the heap with the last sweep finished, just before collecting.
        def collecting(reading, kind = :minor)
          super
          heaps = reading.fetch(:heaps)
          @before = [reading.fetch(:stat).fetch(:count), heaps.map { |h| h.fetch(:total_allocated_objects) },
                     heaps.map { |h| h.fetch(:total_freed_objects) }]
        end

        def decide(reading, profile, headroom: @headroom)
          @objects, _, @beyond = profile.learned unless profile.empty?
          super
        end

        # Also where the last out-of-band minor left a pool short (#nofree?)
        # and no GC has run since: the next GC is a major.
        def major_pending?(reading)
          (!@nofree_at.nil? && @nofree_at == reading.fetch(:stat).fetch(:count)) || super
        end

        # A major Ruby ran (inside a request, or growing the heap) is seen
        # at the next reading; its live counts then include unswept garbage,
        # which errs towards fewer majors.
        def observe(reading, allocated_before: nil)
          stat = reading.fetch(:stat)
          majors = stat.fetch(:major_gc_count)
          seen_major(reading) if @majors && majors != @majors
          @majors = majors
        end

        # kind :grown: the collector grew the heap with no GC run.
        def collected(kind, reading)
          return if kind == :grown

          super
          marked(kind, reading)
          nofree_after(kind, reading)
        end

        # Whether Ruby would ask for a major (NOFREE) after the minor just
        # run, had allocation started it: some pool the requests allocate in
        # keeps, beyond the room for the next request, less than Ruby's free
        # minimum of its slots (its own and its allocatable pages), not within
        # OLD_AGE GCs of a major (Ruby grows the pool then), and a major would
        # give that room back: the pool's live objects have grown since the
        # last major by at least what it lacks. Where it would not, the pool
        # needs growth, not majors (a cache that keeps growing).
        def nofree?(reading)
          return false unless (lacking = lacking(reading))
          return false if grows_instead?(reading)

          lives = lives(reading)
          lacking.each_with_index.any? { |slots, i| slots.positive? && major_frees?(lives, i, slots) }
        end

        # Slots per pool Ruby would have grown after the GC just run, had
        # allocation started it: a pool #nofree? finds short where Ruby grows
        # it rather than ask for a major (within OLD_AGE GCs of a major, or
        # where a major would not give the room back). Ruby does not grow a
        # pool that an out-of-band GC leaves with its room, so without this
        # nothing did: on "huge" (3.3, 290,000 objects a request, all garbage
        # once it ends) the main pool stayed short, and a GC ran after every
        # request where Ruby alone, collecting mid-request, grew its heap and
        # ran one every 2.3 requests (docs/BENCHMARKS.md).
        def below_minimum(reading)
          return unless (lacking = lacking(reading))

          ruby_grows(reading, lacking)
        end

        # Slots per pool that the heap's sizing adds: under Ruby's free
        # minimum, what Ruby would grow (#below_minimum); above it by less
        # than one more request's reserve, enough to be that far clear. A
        # pool sized to just above the minimum stays there: each cycle's
        # promoted objects take a few slots, and the minor that takes it
        # under makes the next GC a major that gives back as little, where
        # Ruby's own growth, to its free goal (40%), leaves a pool far above.
        # On "promoting" behind Puma with `plugin :memkit` (3.3, workers
        # forked from a compacted master) the main pool sat 11-159 slots
        # above the minimum for 40 GCs, then ran a 100 ms major that freed 72
        # slots, and the sizing grew the pool right after it anyway.
        def clearance(reading)
          return unless (lacking = lacking(reading))

          below = ruby_grows(reading, lacking)
          lacking.each_with_index.map do |slots, i|
            next below[i] if slots.positive?

            need = @objects.fetch(i, 0)
            clear = slots + reserve(need, @headroom, @beyond[i])
            need.positive? && clear.positive? ? clear.ceil : 0
          end
        end

        private

        # Per pool, the slots it lacks, beyond the room for the next request,
        # to keep Ruby's free minimum of its slots (its own and its
        # allocatable pages); nil where that cannot be read yet.
        def lacking(reading)
          return unless @objects
          # Mid-sweep with no estimate, the free counts are not final.
          return if reading.fetch(:info)[:state] == :sweeping && !lazy_sweep?(reading)

          free = free(reading)
          reading.fetch(:heaps).each_with_index.map do |h, i|
            need = @objects.fetch(i, 0)
            next 0 unless need.positive?

            total = h.fetch(:heap_eden_slots) + allocatable_in(h)
            (total * @min_free_ratio) - (free[i] - reserve(need, @headroom, @beyond[i]))
          end
        end

        # #below_minimum from the pools' #lacking slots.
        def ruby_grows(reading, lacking)
          young = grows_instead?(reading)
          lives = lives(reading)
          lacking.each_with_index.map do |slots, i|
            slots.positive? && (young || !major_frees?(lives, i, slots)) ? slots.ceil : 0
          end
        end

        # Within OLD_AGE GCs of a major, Ruby grows a pool its GC leaves short
        # instead of asking for a major.
        def grows_instead?(reading) = @major_at && reading.fetch(:stat).fetch(:count) - @major_at < OLD_AGE

        # Whether a major would give pool `i` the `slots` it lacks back: its
        # live objects have grown since the last major by at least that.
        def major_frees?(lives, i, slots)
          base = @live_at_major&.fetch(i, nil)
          base.nil? || lives[i] - base >= slots
        end

        # #free as the pools' slots and Ruby's allocatable pages give it.
        def free_slots(reading)
          shared = reading.fetch(:stat).fetch(:heap_allocatable_slots, 0)
          lives = lives(reading)
          reading.fetch(:heaps).each_with_index.map do |h, i|
            slot_size = h.fetch(:slot_size, BASE_SLOT_SIZE)
            h.fetch(:heap_eden_slots) - lives[i] + allocatable_in(h) + (shared * BASE_SLOT_SIZE / slot_size)
          end
        end

        # Ruby 3.2/3.3's own major after a minor that left a pool short (see
        # #nofree?).
        def nofree_after(kind, reading)
          @majors = reading.fetch(:stat).fetch(:major_gc_count)
          if kind == :major
            seen_major(reading)
          elsif kind == :minor
            @nofree_at = (reading.fetch(:stat).fetch(:count) if nofree?(reading))
          end
        end

        # After a `kind` GC this process ran (`reading`, just after it): where
        # a minor left its sweep to the requests, the Sweep estimate (after a
        # major, the old garbage it frees is not in it); and the mark's
        # allocation counts, for the next one.
        def marked(kind, reading)
          count = reading.fetch(:stat).fetch(:count)
          heaps = reading.fetch(:heaps)
          @sweep = nil
          before = @before
          @before = nil
          if kind == :minor && before && reading.fetch(:info)[:state] == :sweeping && @marked &&
             @marked[0] == before[0] && count == before[0] + 1
            _, allocated, freed = before
            since = allocated.each_with_index.map { |a, i| a - @marked[1].fetch(i) }
            occupied = allocated.each_with_index.sum { |a, i| a - freed[i] }
            garbage = occupied - reading.fetch(:stat).fetch(:heap_marked_slots)
            survivors = [since.sum - garbage, 0].max
            @sweep = Sweep.new(count, since.map { |a| [a - survivors, 0].max }, freed)
          end
          @marked = [count, heaps.map { |h| h.fetch(:total_allocated_objects) }]
        end

        # The Sweep estimate that holds for `reading`, if any.
        def sweep_of(reading)
          sweep = @sweep
          return unless sweep && reading.fetch(:info)[:state] == :sweeping

          sweep if sweep.count == reading.fetch(:stat).fetch(:count)
        end

        def seen_major(reading)
          @major_at = reading.fetch(:stat).fetch(:count)
          @live_at_major = lives(reading)
          @nofree_at = nil
        end

        def allocatable_in(heap)
          pages = heap.fetch(:heap_eden_pages)
          per_page = pages.zero? ? 0 : heap.fetch(:heap_eden_slots) / pages
          heap.fetch(:heap_allocatable_pages, 0) * per_page
        end
      end
    end
  end
end
