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
      # The largest share of the heap growth leaves free after a GC: under
      # Ruby's GC_HEAP_FREE_SLOTS_MAX_RATIO (0.65), where it gives pages back.
      MAX_FREE_SHARE = 0.6
      # Ruby's GC_MALLOC_LIMIT_MAX default.
      MALLOC_LIMIT_MAX = 32 << 20
      # Slots kept free beyond the learned request, at most (see #reserve).
      SLACK = 1_000
      # And at least: the collector's own reading of the heap, which the
      # requests after a quiet stretch do not count.
      LEAST_SLACK = 100

      def self.detect(gc = GC)
        if gc.respond_to?(:stat_heap) && gc.stat_heap(0).key?(:total_allocated_objects)
          gc.respond_to?(:config) && gc.config.key?(:rgengc_allow_full_mark) ? NoFullMark : SizePools
        else
          OneHeap
        end
      end

      attr_reader :headroom, :malloc_limit_max

      def initialize(headroom: 1.1, min_free_ratio: MIN_FREE_RATIO,
                     malloc_limit_max: Integer(ENV.fetch("RUBY_GC_MALLOC_LIMIT_MAX", MALLOC_LIMIT_MAX),
                                               exception: false))
        @headroom = headroom.to_f
        @min_free_ratio = min_free_ratio.to_f
        @malloc_limit_max = malloc_limit_max || MALLOC_LIMIT_MAX
      end

      def name = self.class.name.split("::").last

      # Slot size per pool where the pools draw on one shared count of
      # allocatable slots (Ruby 3.4) and some remain, else nil.
      def shared_slot_sizes(reading)
        heaps = reading[:heaps]
        return unless heaps && reading.fetch(:stat).fetch(:heap_allocatable_slots, 0).positive?

        slot_sizes(heaps)
      end

      # Slot size per pool of `heaps` (a reading's GC.stat_heap hashes).
      def slot_sizes(heaps) = heaps.map { |h| h.fetch(:slot_size, SizePools::BASE_SLOT_SIZE) }

      # Whether #free is right in `reading`, taken while the sweep of the GC
      # this process just ran is under way (see OneHeap, SizePools).
      def lazy_sweep?(_reading) = false

      # Whether #free will be right while the sweep of a `kind` GC run now,
      # `apart` requests after the last GC, is under way.
      def reads_sweep?(_reading, _kind, _apart) = false

      # Whether the out-of-band GC about to run leaves its sweep to the next
      # allocations, as Ruby's own GCs do. Always where #free can be read
      # mid-sweep (#reads_sweep?): a GC.start that sweeps at once holds the
      # next request for the whole sweep, most of the pause (a minor on the
      # "medium" shape on 3.4: 1.4-1.7 ms of mark, 5.6 ms of sweep; see
      # bench/oobgc_pause.rb), where Ruby's own GC sweeps a few pages at a
      # time as requests allocate: p99 latency up to 5.3x that of no OobGC
      # on the "tiny" and "medium" shapes on 3.3 and 3.4.
      # Elsewhere when the GC is due for malloc'd bytes while the pools hold
      # several more requests. Swept at once, a GC frees the garbage's
      # malloc'd memory inside itself, before Ruby counts it against the
      # malloc growth since that GC; swept lazily, the frees come after and
      # offset the next requests' mallocs, as they do under Ruby alone
      # (bench/oobgc_shapes.rb "malloc": 248 GCs swept at once, where Ruby
      # alone ran 64). Mid-sweep, #free counts the unswept garbage as live:
      # it errs low, towards collecting early, never late.
      def sweep_lazily?(reading, profile, kind: :minor, apart: 0)
        reads_sweep?(reading, kind, apart) ||
          (!profile.empty? && !pools_short?(reading, profile, @headroom + LAZY_REQUESTS))
      end

      # Requests' worth of free slots beyond the headroom that let a malloc
      # GC sweep lazily.
      LAZY_REQUESTS = 3

      # Called with each reading taken after a request; `allocated_before`
      # is total_allocated_objects when that request started.
      def observe(_reading, allocated_before: nil); end

      # Called with the reading right after a GC this process ran.
      def collected(kind, reading)
        stepped(kind, reading)
      end

      def decide(reading, profile, headroom: @headroom)
        return if profile.empty?
        # A major Ruby has asked for starts at the first allocation that finds
        # its pool's list of free pages empty: while one is pending, Ruby adds
        # no allocatable page and keeps back the pages its sweep set aside for
        # the major's incremental marking (bench/demo_puma: on 3.3 a GC after
        # 0 allocations with 3,075 slots shown free; on 3.4 after 60% of
        # them). #free cannot see those pages, so the major runs now, as
        # Ruby's next GC would have been.
        return :major if major_asked?(reading)

        short = pools_short?(reading, profile, headroom) || malloc_short?(reading, profile.malloc, headroom)
        return unless short

        kind(reading)
      end

      # Whether the GC due is due for malloc'd bytes alone: the pools hold the
      # next request, the malloc limit does not.
      def malloc_due?(reading, profile, headroom: @headroom)
        !profile.empty? && !pools_short?(reading, profile, headroom) &&
          malloc_short?(reading, profile.malloc, headroom)
      end

      # The GC #decide answers once one is due, as the heap stands: it moves
      # only when a GC runs, and with oldmalloc (see #oldmalloc_over?).
      def kind(reading)
        major_pending?(reading) || minor_would_fill?(reading) ? :major : :minor
      end

      # How much may still be allocated before #decide (at `headroom`) can
      # answer anything but nil: objects per pool and malloc'd bytes (nil: no
      # bound). Until a GC runs, what #decide reads moves only with
      # allocation (free slots fall and malloc counters rise by what is
      # allocated), so the collector takes no reading while the allocation
      # since this one stays within these. nil if something is due now.
      def margins(reading, profile, headroom: @headroom)
        return Margins.new([], nil) if profile.empty?
        return if decide(reading, profile, headroom: headroom)

        objects = profile.objects
        beyond = profile.beyond
        pools = free(reading).each_with_index.map do |f, i|
          need = objects.fetch(i, 0)
          f - reserve(need, headroom, beyond[i]).ceil if need.positive?
        end
        Margins.new(pools, malloc_margin(reading, profile.malloc, headroom), slot_sizes: shared_slot_sizes(reading))
      end

      # #margins as they would have been at the same reading had the profile
      # learned `to` in place of `from` (each Profile#learned): a relearn
      # moves the reserves, not the heap, so the margins move by the
      # difference. The quiet stretch then outlasts the relearn
      # that a high percentile makes every quarter window, most of them by a
      # few objects. nil where a pool `from` did not bound now needs room:
      # its free slots are not in the margins. The malloc margin only ever
      # falls: it may be a bound that does not move with the profile
      # (NoFullMark's oldmalloc room).
      def remargin(margins, from, to, headroom: @headroom)
        was, _, was_beyond = from
        now, _, now_beyond = to
        return if was.empty?

        objects = margins.objects.each_with_index.map do |margin, i|
          need = now.fetch(i, 0)
          next unless need.positive?
          return unless margin

          margin + reserve(was.fetch(i, 0), headroom, was_beyond[i]).ceil - reserve(need, headroom, now_beyond[i]).ceil
        end
        fall = [(from.fetch(1) * headroom).ceil - (to.fetch(1) * headroom).ceil, 0].min
        malloc = margins.malloc && (margins.malloc + fall)
        Margins.new(objects, malloc, slot_sizes: margins.slot_sizes)
      end

      # What #margins answers: how much may be allocated, objects per pool
      # and malloc'd bytes (nil: no bound), before #decide can answer
      # anything but nil.
      class Margins
        # Ruby 3.4's pools take new pages from one shared count of allocatable
        # slots, which #free counts in every pool: a page one pool takes is
        # room the others lose. Where that holds (`slot_sizes` given), each
        # pool's margin is charged the bytes the other pools allocated too, and
        # a page's worth per pool for pages taken but not yet filled.
        PAGE_BYTES = 64 << 10

        attr_reader :objects, :slot_sizes
        attr_accessor :malloc

        def initialize(objects, malloc, slot_sizes: nil)
          @objects = objects
          @malloc = malloc
          @slot_sizes = slot_sizes
        end

        # The smallest pool margin, a bound on all allocation together; nil
        # where pools share pages (no such bound) or none is bounded.
        def least = @slot_sizes ? nil : @objects.compact.min

        # Whether nothing can be due yet, with `now` and `base` the objects
        # allocated per pool now and at the reading, and `malloc` the bytes
        # malloc'd since.
        def holds?(now, base, malloc)
          return false if @malloc && malloc > @malloc

          sizes = @slot_sizes
          bytes = 0
          if sizes
            i = 0
            while i < sizes.size
              bytes += (now[i] - base[i]) * sizes[i]
              i += 1
            end
            bytes += PAGE_BYTES * (sizes.size - 1)
          end
          i = 0
          while i < @objects.size
            if (margin = @objects[i])
              own = now[i] - base[i]
              charged = sizes ? own + ((bytes - (own * sizes[i])) / sizes[i]) : own
              return false if charged > margin
            end
            i += 1
          end
          true
        end
      end

      # Slots each pool lacks, as the heap stands, to hold `cover` requests,
      # or as many as the pool most of a request's objects go to holds (up to
      # `balance`): where a small size pool runs dry after a few requests
      # while the main one holds many, the small one decides how often GC
      # runs, and growing it costs little.
      #
      # `want` (more than `cover`, which must fit): each pool holds `want`
      # times the free slots at which the collector runs a GC (#reserve),
      # and one more. Ruby alone at the same heap collects once a pool has
      # none left, F free slots after a GC; the collector once it has
      # `reserve` left, F / (F - reserve) times as often: at most (want + 1)
      # / want. Sized for `want` requests instead, a pool a request uses
      # unevenly (the reserve is 1.1 times a high percentile, and a slack)
      # collected 1.18x Ruby's GC runs on the Rails bench app. Only up to
      # where Ruby would give the pages back: a GC that finds more than 65%
      # of the heap free (GC_HEAP_FREE_SLOTS_MAX_RATIO) frees pages down to
      # that share, so a heap grown past it shrinks at the next GC and
      # growing it again costs major GCs. And a pool Ruby would have grown,
      # had allocation started the GC, grows too (#below_minimum), as does
      # one close to where Ruby would (#clearance).
      def shortfall(reading, profile, cover:, want: cover, balance: 16)
        free = free(reading)
        objects = profile.objects
        beyond = profile.beyond
        main = objects.each_with_index.max_by(&:first)&.last
        held = main && objects[main].positive? ? free.fetch(main, 0).fdiv(objects[main]) : 0
        target = [cover, [held, balance].min].max
        wanted = []
        if want > cover && objects.sum.positive?
          wanted = objects.each_with_index.map do |need, i|
            need.positive? ? (want + 1) * reserve(need, @headroom, beyond[i]) : 0
          end
          room = most_free(live(reading))
          scale = [1.0, room.fdiv(wanted.sum)].min
          wanted.map! { |slots| slots * scale }
          clearance(reading)&.each_with_index do |slots, i|
            wanted[i] = [wanted.fetch(i, 0), free[i] + slots].max if slots.positive?
          end
        end
        free.each_with_index.map do |f, i|
          slots = [objects.fetch(i, 0) * target, wanted.fetch(i, 0)].max.ceil
          slots > f ? slots - f : 0
        end
      end

      # Free slots a heap with `live` objects keeps after a GC before Ruby
      # gives pages back (MAX_FREE_SHARE of the heap free).
      def most_free(live) = live * MAX_FREE_SHARE / (1 - MAX_FREE_SHARE)

      # Free slots in a pool below which the collector runs a GC: the
      # request's objects at the headroom, and a slack of what the largest
      # request learned allocated `beyond` them (Profile#beyond; unknown:
      # SLACK), from LEAST_SLACK to SLACK, no more than the request itself.
      # A fixed 1,000 slots was most of the room a cycle left unused on the
      # Rails bench app, whose largest request is within 2-18 objects of its
      # 95th percentile, and which Ruby alone uses up: on its recorded
      # requests (bench/oobgc_replay.rb) 1.082x Ruby alone's GC runs, 1.032x
      # with this slack, and live 1.07-1.10x where it ran 1.10-1.11x. Where a
      # twentieth of the requests are 2-4 times the rest, the largest sets
      # the slack at SLACK and 98.7% of the GC runs stay out of requests,
      # where 100 slots kept 93.4%.
      def reserve(need, headroom = @headroom, beyond = nil)
        slack = beyond ? beyond.clamp(LEAST_SLACK, SLACK) : SLACK
        (need * headroom) + [slack, need].min
      end

      # Requests each pool's `free` slots hold, at `objects` per request
      # (infinite for a pool requests do not use).
      def held(free, objects)
        free.each_with_index.map do |f, i|
          need = objects.fetch(i, 0)
          need.positive? ? f.fdiv(need) : Float::INFINITY
        end
      end

      # Pool indices by how many requests their free slots hold at `objects`
      # per request, fewest first (pools requests do not use last). Grown in
      # index order, the main pool (0) could take the whole budget and leave
      # the pool that runs dry first as it was: on 3.3 a GC every 2 requests
      # where Ruby alone ran one every 3.
      def driest_first(reading, objects)
        held = held(free(reading), objects)
        held.each_index.sort_by { |i| [held[i], i] }
      end

      # Whether the next request cannot fit even in a heap just collected.
      def starved?(reading, profile)
        free(reading).each_with_index.any? { |f, i| f < profile.objects.fetch(i, 0) }
      end

      # Whether a heap just collected has fewer free slots than #decide keeps
      # in reserve: the next request may run out of them, and GC inside.
      def cramped?(reading, profile) = !profile.empty? && pools_short?(reading, profile, @headroom)

      # Whether Ruby has asked for a major (need_major_by, 3.3+) that the
      # collector is to run.
      def major_asked?(reading) = !reading.fetch(:info)[:need_major_by].nil?

      # Whether the major Ruby asks for (`need`, latest_gc_info's
      # need_major_by) is one #major_asked? turned down at GC `count`: for
      # the collector's checks between readings.
      def declined?(_need, _count) = false

      # After a minor GC: whether Ruby has made the next GC a major one.
      # Ruby 3.3+ says so (need_major_by); 3.1 does not for oldmalloc, and
      # #collecting saw it coming.
      def major_next?(reading)
        info = reading.fetch(:info)
        return major_asked?(reading) if info.key?(:need_major_by)

        @oldmalloc_over == true
      end

      # After a minor GC: whether a major is pending (#major_pending?) and
      # the heap, as Ruby uses it until that major runs, cannot hold the next
      # request. Then it runs at once, in the same pause; otherwise when
      # #decide finds it due, where Ruby would have run it.
      def major_due?(reading, profile)
        !profile.empty? && major_pending?(reading) && pools_short?(reading, profile, @headroom)
      end

      # Whether oldmalloc is past its limit: the next minor GC will raise the
      # limit and ask for a major, which then runs at once (see #major_pending?).
      def oldmalloc_over?(reading)
        stat = reading.fetch(:stat)
        stat.fetch(:oldmalloc_increase_bytes) > stat.fetch(:oldmalloc_increase_bytes_limit)
      end

      # RUBY_GC_* values that would give a worker, from boot, the heap it has
      # in `reading` (grown, or as Ruby sized it), and at least the free
      # slots to hold `cover` requests of `profile` beside its live objects.
      # The heap it has is its pages in use, not the allocatable pages Ruby
      # would add later: on the Rails bench app (Ruby 3.3) a pool kept 35
      # such pages it never took, 2.2 MB per worker that Ruby alone, booted
      # with them, allocated. Slots are rounded up to whole pages, as Ruby
      # allocates them, and no further: a GC cycle's allocation all goes into
      # the free slots, so a thousand more in the main pool (101,000 free
      # after a minor there) is 1% fewer GC runs for Ruby alone at that heap
      # than the worker had.
      def boot_env(reading, profile, cover:)
        return {} if profile.empty?

        env = init_slots_env(reading, profile.objects, cover)
        malloc = (profile.malloc * cover).ceil
        if malloc > reading.fetch(:stat)[:malloc_increase_bytes_limit].to_i
          env["RUBY_GC_MALLOC_LIMIT"] = limit = round_up(malloc, 1_000)
          # Ruby caps the limit it raises at each overrun at the maximum, below
          # a higher minimum too.
          env["RUBY_GC_MALLOC_LIMIT_MAX"] = limit if malloc > @malloc_limit_max
        end
        env
      end

      # Free slots per pool, counting the pages Ruby may still add without
      # collecting first.
      def free(reading) = raise(NotImplementedError)

      # Slots per pool that Ruby, after the GC just run, would grow but will
      # not, since the GC ran out of band (nil: none, or the policy keeps
      # Ruby's free minimum itself).
      def below_minimum(_reading) = nil

      # Slots per pool the heap's sizing adds for Ruby's free minimum: what
      # #below_minimum grows, and some for a pool close above it (nil: no
      # such floor here).
      def clearance(_reading) = nil

      # Slots holding live objects, all pools together (an overestimate
      # mid-sweep: the garbage not yet swept counts).
      def live(reading) = raise(NotImplementedError)

      # Whether Ruby has decided the next GC will be major, so the
      # out-of-band one must be too.
      #
      # Not oldmalloc past its limit: Ruby looks at oldmalloc only at the end
      # of a minor GC (gc_reset_malloc_info), where an overrun raises the
      # limit by 1.2x (to RUBY_GC_OLDMALLOC_LIMIT_MAX) and asks for a major,
      # while a major it did not ask for lowers the limit by 2%. A major run
      # here for the overrun would be one Ruby did not ask for: the limit
      # would stay at its minimum and majors follow most requests of an app
      # that mallocs megabytes (bench/oobgc_shapes.rb "malloc": 205 majors in
      # 600 requests where Ruby ran 9). So the GC due runs as a minor, Ruby
      # raises the limit and asks, and the collector runs the major it asked
      # for right after, in the same pause (#major_next?).
      def major_pending?(reading)
        return true if major_asked?(reading)

        stat = reading.fetch(:stat)
        return true if stat.fetch(:old_objects) >= stat.fetch(:old_objects_limit)

        limit = stat.fetch(:remembered_wb_unprotected_objects_limit, 0)
        limit.positive? && stat.fetch(:remembered_wb_unprotected_objects) >= limit
      end

      # Whether the minor about to run would take old or remembered shady
      # objects past their limits, each growing by what it grew at the last
      # out-of-band minor: Ruby's test at the end of a mark
      # (gc_marks_finish), which asks for a major, then run at once in the
      # same pause. Run alone instead, it is one GC, not two (on Ruby 3.1's
      # bench Rails app behind Puma, one GC run more per major); and it is
      # known before the response goes out, so a kept-alive client is told
      # to reconnect rather than wait it out.
      def minor_would_fill?(reading) = flags_would_pass?(reading.fetch(:stat))

      # Told the heap as it stands just before this process collects (kind:
      # :minor or :major), with the last GC's sweep finished: Ruby finishes
      # it before the next GC and only then compares oldmalloc with its
      # limit, and the sweep's frees lower oldmalloc.
      def collecting(reading, kind = :minor)
        @oldmalloc_over = kind == :minor && oldmalloc_over?(reading)
        # What a minor moves these by is the next one's estimate (#stepped).
        stat = reading.fetch(:stat)
        @old_before = stat.fetch(:old_objects)
        @shady_before = shady(stat)
      end

      private

      # After an out-of-band minor: how far it moved old and remembered shady
      # objects.
      def stepped(kind, reading)
        return unless kind == :minor && @old_before

        stat = reading.fetch(:stat)
        @steps = [stat.fetch(:old_objects) - @old_before, shady(stat) - @shady_before].map { |d| [d, 0].max }
      end

      def flags_would_pass?(stat)
        old_step, shady_step = @steps
        return false unless old_step

        limit = stat.fetch(:remembered_wb_unprotected_objects_limit, 0)
        stat.fetch(:old_objects) + old_step > stat.fetch(:old_objects_limit) ||
          (limit.positive? && shady(stat) + shady_step > limit)
      end

      def shady(stat) = stat.fetch(:remembered_wb_unprotected_objects, 0)

      def pools_short?(reading, profile, headroom)
        objects = profile.objects
        beyond = profile.beyond
        free(reading).each_with_index.any? do |f, i|
          need = objects.fetch(i, 0)
          need.positive? && f < reserve(need, headroom, beyond[i])
        end
      end

      # Ruby raises its malloc limit (by 1.4x, up to RUBY_GC_MALLOC_LIMIT_MAX)
      # only at a GC that finds it overrun, and lowers it by 2% at every other.
      # Collected by GC.start before each overrun, the limit stayed at its
      # minimum and an app that mallocs megabytes collected after most
      # requests (bench/oobgc_shapes.rb "malloc": 600 GCs where Ruby ran 61).
      # So the GC due for malloc runs as an overrun of Ruby's own
      # (Collector#overrun_malloc), at any limit: left to Ruby while the limit
      # was low, it ran inside a request every time the limit had fallen
      # back (the "tiny" shape's one GC inside per worker, at request 116).
      def malloc_short?(reading, malloc, headroom) = malloc_margin(reading, malloc, headroom).negative?

      # Bytes that may still be malloc'd before #decide answers otherwise.
      def malloc_margin(reading, malloc, headroom)
        stat = reading.fetch(:stat)
        stat.fetch(:malloc_increase_bytes_limit) - stat.fetch(:malloc_increase_bytes) - (malloc * headroom).ceil
      end

      # RUBY_GC_HEAP_*INIT_SLOTS of #boot_env.
      def init_slots_env(_reading, _objects, _cover) = raise(NotImplementedError)

      def round_up(value, unit) = ((value + unit - 1) / unit) * unit
    end
  end
end

require_relative "policy/one_heap"
require_relative "policy/size_pools"
require_relative "policy/no_full_mark"
