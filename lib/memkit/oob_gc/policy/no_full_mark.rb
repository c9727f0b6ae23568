# frozen_string_literal: true

module Memkit
  class OobGC
    class Policy
      # Ruby 3.4+ with GC.config(rgengc_allow_full_mark: false) while serving:
      # Ruby never starts a major GC itself; where it would, it grows the heap
      # and sets latest_gc_info(:need_major_by). So every major is ours, run
      # between requests as soon as one is due, slots short or not; one asked
      # for want of free slots only where it would free something
      # (#major_asked?).
      #
      # Safety valve: a heap that has grown past `valve_ratio` times its size
      # at the last major while Ruby asks for a major (an app whose old
      # objects are garbage faster than requests end, with no idle moment to
      # run one) gives full marks back to Ruby: the collector reads #valve?
      # and says so. Growth with no major asked for is Ruby's own sizing (a
      # worker's heap grows during its first requests): not the valve's case.
      class NoFullMark < SizePools
        # Ruby's initial slots per pool (GC_HEAP_INIT_SLOTS in gc/default.c),
        # unless RUBY_GC_HEAP_<n>_INIT_SLOTS was set at boot. Below it, a pool
        # takes new pages as allocation needs them, with no GC; and Ruby's
        # sweep asks the pool to keep 20% of the larger of the two free.
        INIT_SLOTS = 10_000

        # The initial slots per pool this process booted with.
        def self.init_slots(env = ENV, pools: GC::INTERNAL_CONSTANTS.fetch(:HEAP_COUNT, 5))
          Array.new(pools) do |i|
            Integer(env.fetch("RUBY_GC_HEAP_#{i}_INIT_SLOTS", INIT_SLOTS), exception: false) || INIT_SLOTS
          end
        end

        # Bytes of pages one growth takes at most: the requests that queue
        # behind it wait while the collector fills them. On Unicorn "large"
        # (3.4) the saturated p99 was 141 ms taking whole steps, 25 ms with
        # this (one run each; Ruby alone 27 ms).
        STEP_BYTES = 8 << 20

        def initialize(valve_ratio: 2.0, init_slots: self.class.init_slots, step_bytes: STEP_BYTES, **options)
          super(**options)
          @step_bytes = step_bytes
          @valve_ratio = valve_ratio.to_f
          @init_slots = init_slots
          @baseline = nil
          @marked_after_minor = nil # heap_marked_slots after the latest minor
          @major_from = nil # [@marked_after_minor, #allocated, @settled] as a major started
          @allocated_at_major = nil # #allocated as the latest major started
          @aside = 0 # objects the collector allocated itself (#allocated_aside)
          @garbage_rate = nil # old garbage a major found, per object allocated since the one before
          @declined_at = nil # GC count at which a :nofree major was turned down
          @settled = false # whether the request profile had settled at a #decide
          @settled_major = false # whether a major ran since the profile settled
          @swept_free = nil # [GC count, free slots per pool] after the latest GC (#kept_back)
        end

        # Ruby looks at oldmalloc only at the end of a minor GC; with full
        # marks off, a worker whose heap holds many requests may run none
        # for thousands, while oldmalloc (malloc by objects that have aged)
        # goes far past its limit. So oldmalloc past the limit makes a minor
        # due at once: Ruby raises the limit and asks for the major, which
        # the collector then runs (see Policy#major_pending?).
        #
        # The first GC due once the profile has settled is a major: it frees
        # what the worker's first requests promoted and dropped, and gives
        # the garbage rate (#found_garbage) that #major_asked? weighs Ruby's
        # `:nofree` majors by. Where it did not run, on the "promoting" shape
        # (3.4, Unicorn) a worker whose one major came amid its first
        # requests' promotions kept 200,000 more old objects than one whose
        # major came after them, never ran another (Ruby asked for none), and
        # collected every 22 requests where the other did every 34.
        def decide(reading, profile, headroom: @headroom)
          @settled ||= profile.settled?
          return :major if major_pending?(reading)
          return :minor if !profile.empty? && oldmalloc_over?(reading)

          due = super
          due == :minor && @settled && !@settled_major ? :major : due
        end

        def margins(reading, profile, headroom: @headroom)
          margins = super or return
          stat = reading.fetch(:stat)
          oldmalloc = stat.fetch(:oldmalloc_increase_bytes_limit) - stat.fetch(:oldmalloc_increase_bytes)
          margins.malloc = [margins.malloc, oldmalloc].compact.min
          margins
        end

        # Also the slots a pool under its initial slots takes as new pages
        # with no GC once its sweep is done (heap_prepare; the 640-byte pool
        # went from 304 slots to 3,358 with no GC). Ruby 3.3 shows them as
        # the pool's heap_allocatable_pages, which #free counts; 3.4 shows
        # nothing, and such a pool looked full: on the Rails app the 320- and
        # 640-byte pools (6,700 and 2,400 slots) made 4-6% of the out-of-band
        # GCs due, GCs Ruby would not have run.
        #
        # Less, where a major turned down is pending, the slots the sweep
        # keeps back (#kept_back).
        def free(reading)
          heaps = reading.fetch(:heaps)
          kept = kept_back(reading)
          free_slots(reading).each_with_index.map { |f, i| f + below_init(heaps.fetch(i), i) - kept.fetch(i, 0) }
        end

        # Kept in #growth_shortfall (#floor), grown to Ruby's free goal.
        def below_minimum(_reading) = nil
        def clearance(_reading) = nil

        # kind :grown: the collector grew the heap, which the valve must not
        # take for Ruby's growth (no GC ran).
        def collected(kind, reading)
          super
          # The free slots per pool the sweep of this GC hands out, all told
          # (#kept_back); mid-sweep, by the estimate of its garbage.
          @swept_free = [reading.fetch(:stat).fetch(:count), free_slots(own(reading))] unless kind == :grown
          @baseline = available(reading) if kind == :major || kind == :grown || @baseline.nil?
          stat = reading.fetch(:stat)
          if kind == :minor
            @marked_after_minor = stat.fetch(:heap_marked_slots)
          elsif kind == :major
            @settled_major ||= @settled
            found_garbage(stat) if @major_from
          end
        end

        def collecting(reading, kind = :minor)
          super
          return unless kind == :major

          @major_from = [@marked_after_minor, allocated(reading), @settled]
        end

        # The collector allocated `objects` itself: fillers that run a pool
        # dry or make it take pages (DryGrowth). They die young, so they are
        # not what a major's old garbage comes with (#worth_major?): counted,
        # about 800,000 fillers of a minor run as Ruby's own where a `:nofree`
        # major had been turned down made that major worth running right
        # after it, on the "tiny" shape (3.4, Puma) a pause of 260 ms in all.
        def allocated_aside(objects)
          @aside += objects
        end

        def observe(reading, allocated_before: nil)
          @baseline ||= available(reading)
          @allocated_at_major ||= allocated(reading)
          # After a GC of Ruby's own (inside a request, or for malloc'd bytes),
          # #kept_back counts from the first reading since.
          count = reading.fetch(:stat).fetch(:count)
          @swept_free = [count, free_slots(own(reading))] unless @swept_free&.first == count
        end

        # Ruby asks for a `:nofree` major when a minor's sweep leaves a pool
        # under its free minimum; with full marks off it grows the heap
        # meanwhile. The major is worth its pause where it frees old garbage,
        # and not where the old objects are live: on the "cache" shape (a
        # cache that grows by 40 rows a request, Ruby 3.4, Puma) Ruby asked
        # every 120-150 requests, each major took 63-85 ms and freed almost
        # nothing, and the heap grew anyway (docs/BENCHMARKS.md, "majors
        # that free nothing"). So a `:nofree` major is turned down where the
        # old garbage the latest major found, per object allocated since the
        # one before, would not have grown by now to one request's objects.
        # Ruby's other reasons (old objects or oldmalloc past their limits)
        # always run, and give the estimate again.
        def major_asked?(reading)
          need = reading.fetch(:info)[:need_major_by] or return false
          return true unless need == :nofree && @garbage_rate

          count = reading.fetch(:stat).fetch(:count)
          return false if @declined_at == count
          return true if worth_major?(reading)

          @declined_at = count
          false
        end

        def declined?(need, count) = need == :nofree && @declined_at == count

        # Whether Ruby has a major pending that #major_asked? turned down.
        def turned_down?(reading)
          need = reading.fetch(:info)[:need_major_by]
          !need.nil? && declined?(need, reading.fetch(:stat).fetch(:count))
        end

        # The pool a request uses whose free slots hold the fewest requests.
        def runs_out_first(reading, profile)
          objects = profile.objects
          driest_first(reading, objects).find { |i| objects.fetch(i, 0).positive? }
        end

        # How the collector should grow the heap, instead of calling
        # GC.start, when pools lack slots: [pool, plan], or nil. `pool` is the
        # one to run dry, so that the minor GC due is Ruby's own and lets the
        # heap grow by #growth_step; `plan` is the slots each pool should take
        # of that step (DryGrowth#take_pages), within `budget` bytes
        # and STEP_BYTES.
        # `reading` is the heap just after a GC; `short` is #growth_shortfall.
        #
        # The plan raises the pools that hold the fewest requests together:
        # first up to `cover` requests, then each pool under Ruby's free
        # minimum to it, then all of them as far as the step and the budget
        # go (each no further than it is short). The pool that runs out first
        # decides how often GC runs: on the "large" shape the main pool, grown
        # for all it lacked, took the whole budget, and the 160-byte pool,
        # holding 6 requests to its 9.7, ran a GC every 5 (1.5x Ruby alone's
        # GC runs at the same heap).
        #
        # The pool run dry is the one that holds the fewest requests where
        # Ruby's step there holds the plan, else the one with the fewest free
        # slots of those whose step does (the cheapest to run dry): run dry,
        # the 160-byte pool of the Rails bench app (45,793 slots) let Ruby
        # add 25,375 slots, which the 80- and 160-byte pools took, and the
        # main pool, planned for 21,941, took none and was grown again, a GC
        # more, three GCs later.
        #
        # With full marks off, Ruby grows the heap only after a GC that
        # allocation started (heap_prepare), as pages any pool may take, and
        # a major grows a pool only if its sweep freed more than it found
        # free, which the major run right after a minor never does.
        # Out-of-band GCs are started by GC.start, so a heap collected only
        # out of band never grew, and a pool left under 20% free asked for a
        # major (`:nofree`) every third minor (docs/BENCHMARKS.md, "OobGC: GC runs per request").
        def grow_by_allocation(reading, short, profile, budget:, cover:)
          return unless budget.positive?

          heaps = reading.fetch(:heaps)
          free = free_slots(own(reading))
          objects = profile.objects
          sizes = slot_sizes(heaps)
          held = held(free, objects)
          under = heaps.each_with_index.map { |h, i| free.fetch(i) < slots_for_free_minimum(h, i) * @min_free_ratio }
          driest = short.each_index.select { |i| short[i].positive? }.min_by do |i|
            [held[i] < cover ? 0 : (under[i] ? 1 : 2), held[i]]
          end or return

          steps = heaps.each_index.map { |i| growth_step(reading, i) }
          dry = heaps.each_index.select { |i| objects.fetch(i, 0).positive? } | [driest]
          plan = Array.new(short.size, 0)
          left = Left.new([budget, @step_bytes].min, dry.map { |i| steps[i] }.max)
          level(plan, cover, held, objects, short, sizes, left)
          short.each_index do |i|
            next unless under[i] && short[i] > plan[i]

            slots = [floor(heaps[i], i, free[i], objects.fetch(i, 0)), short[i]].min - plan[i]
            slots = [slots, left.bytes / sizes[i], left.slots].min
            next unless slots.positive?

            plan[i] += slots
            left.take(slots, sizes[i])
          end
          level(plan, Float::INFINITY, held, objects, short, sizes, left)
          return unless plan.sum.positive?

          pool = steps[driest] >= plan.sum ? driest : dry.select { |i| steps[i] >= plan.sum }.min_by { |i| free[i] }
          [pool, plan]
        end

        # What a growth may still add: bytes, and slots of Ruby's step.
        Left = Struct.new(:bytes, :slots) do
          def take(slots, size)
            self.bytes -= slots * size
            self.slots -= slots
          end
        end

        # Ruby's growth factor (RUBY_GC_HEAP_GROWTH_FACTOR) and free goal
        # (GC_HEAP_FREE_SLOTS_GOAL_RATIO) defaults.
        GROWTH_FACTOR = 1.8
        GOAL_RATIO = 0.4

        # Slots Ruby may add when pool `index` runs dry: heap_prepare grows
        # the heap to `f` times the pool's slots, where `f` would leave the
        # goal ratio free counting the slots the sweep has freed so far, at
        # most the growth factor. Right after the GC the sweep has hardly
        # begun, so `f` is near 1 / (1 - goal ratio): two thirds of the
        # pool's slots. Ruby 3.4 counts them as slots, shared: whichever pool
        # takes a page uses up as many as the page holds of its own.
        def growth_step(reading, index)
          h = reading.fetch(:heaps).fetch(index)
          f = [1 / (1 - GOAL_RATIO), GROWTH_FACTOR].min
          ((f - 1) * h.fetch(:heap_eden_slots)).ceil
        end

        # Slots per pool the heap lacks, just after a GC, to hold `cover`
        # requests (see #shortfall), or to keep Ruby's free minimum
        # (MIN_FREE_RATIO) and one request more: a pool swept to less than
        # that makes Ruby ask for a `:nofree` major within three minors, and
        # that major, run right after a minor, frees nothing and grows
        # nothing. The shared allocatable slots do not count: the next GC that
        # allocation did not start sets them back to zero.
        #
        # A pool under that minimum grows as far as Ruby grows it there, to
        # its free goal (GOAL_RATIO): raised only to the minimum, a pool whose
        # live objects keep growing was short again every third GC, and each
        # growth is a pause of its own (on the "cache" shape, Ruby 3.4, Puma:
        # 12-14 growths per worker in 8 seconds, p99 32-49 ms where it ran
        # 13-15 ms growing to the goal; docs/BENCHMARKS.md, "majors that free
        # nothing").
        def growth_shortfall(reading, profile, cover:, want: cover, spare: 0)
          own = own(reading)
          free = free_slots(own)
          objects = profile.objects
          short = shortfall(own, profile, cover: cover, want: want)
          short = balance(own, short, free, profile, spare) if want > cover && spare.positive?
          lives = lives(own)
          heaps = reading.fetch(:heaps)
          steps = heaps.map { |h| (LEAST_STEP * h.fetch(:heap_eden_slots)).ceil }
          grow = heaps.each_with_index.map do |h, i|
            need = objects.fetch(i, 0)
            next short[i] unless need.positive?

            under = floor(h, i, free[i], need)
            next [short[i], under, to_goal(h, i, free[i])].max if under.positive?
            next short[i] unless short[i].positive? && short[i] < steps[i]

            room(free[i], lives.fetch(i)) >= steps[i] ? steps[i] : 0
          end
          return grow unless grow.any?(&:positive?)

          # A growth costs a GC of its own: each pool it grows, and each that
          # a step more live objects would leave short, grows for that step
          # too (see LEAST_STEP), where the growth then stays within `spare`.
          near = shortfall(crept(own, steps), profile, cover: cover, want: want)
          ahead = grow.each_with_index.map do |slots, i|
            next slots unless near.fetch(i, 0).positive?

            step = [near[i], steps[i]].max
            step > slots && room(free[i], lives.fetch(i)) >= step ? step : slots
          end
          sizes = slot_sizes(heaps)
          ahead.each_with_index.sum { |slots, i| slots * sizes[i] } <= spare ? ahead : grow
        end

        # `reading` with `more` live objects per pool.
        def crept(reading, more)
          heaps = reading.fetch(:heaps).each_with_index.map do |h, i|
            h.merge(total_allocated_objects: h.fetch(:total_allocated_objects) + more.fetch(i, 0))
          end
          reading.merge(heaps: heaps)
        end

        # A pool short of `want` requests grows by a tenth of its slots at
        # least, as Ruby's own growth does (heap_allocatable_slots_expand: f
        # = 1.1 where the goal ratio asks for less), or not at all where a
        # tenth more would pass Ruby's free share (#room). Each growth costs
        # a GC of its own (DryGrowth#spent takes back what Ruby allowed
        # beyond the plan); grown by what they lacked, a page or two, the
        # Rails bench app's pools (3.4) grew 5-6 times between its workers'
        # 101st and 2,600th requests as their live objects crept up, the
        # 160-byte pool by 11 to 545 slots where it held 73% of its slots
        # free: 4-7% of the GC runs. Grown to `want` as each pool came
        # short, the same app's pools grew three times in a worker's first
        # 150 requests, the main pool twice, 70 requests apart, as live
        # objects crept up by thousands: so a growth leaves each pool it
        # grows a step of live objects from short, and takes along the pools
        # a step would leave short, where that fits in the `spare` half of
        # the budget. Beyond it, on the "large" shape, the step ahead took
        # the rest of the budget and Puma's RSS to 1.32-1.33x no OobGC's.
        LEAST_STEP = 0.1

        # Slots a pool with `live` objects and `free` slots after a GC takes
        # before a GC would give pages back (#most_free).
        def room(free, live) = (most_free(live) - free).floor

        # Slots pool `index` (`heap`, `free` slots free after a GC) takes to
        # keep Ruby's free goal: GOAL_RATIO of its slots once grown, or of its
        # initial slots while it stays below them (Ruby's free minimum counts
        # those, #slots_for_free_minimum). Counted on the slots it would
        # have after growing, such a pool overshoots: on the Rails bench app
        # (3.4) the 640-byte pool would grow from 1,624 slots to 6,500 (57%
        # of 10,000 free, 3 MB a worker) where Ruby alone keeps 1,631.
        def to_goal(heap, index, free)
          grown = ((GOAL_RATIO * heap.fetch(:heap_eden_slots)) - free).fdiv(1 - GOAL_RATIO)
          [(GOAL_RATIO * init_slots(index)) - free, grown].max.ceil
        end

        # Share of a request's objects below which a pool's room does not
        # count as a level to raise others to (#balance): a pool a request
        # barely uses holds thousands of requests in a page or two.
        BALANCE_SHARE = 0.01

        # `short` with the pool that holds the fewest requests after a GC
        # raised to all but one request of the next fewest, no further than
        # Ruby's free share (MAX_FREE_SHARE) of its live objects, nor than
        # the requests the malloc limit lets pass between GCs, and within
        # `spare` bytes. The pool that runs out first sets how often GC runs;
        # the room the others keep beyond it is paid for in RSS and idle.
        # Ruby alone grows the pool that runs dry, so its pools come to hold
        # about as many requests each; the collector's GCs come before any
        # pool runs dry, and the pools stay as they were: on the "tiny" shape
        # (3.4, Puma) the main pool held 190 requests, the 160-byte pool 360
        # and the 80-byte pool 1,100, and the collector ran 1.5-2x Ruby
        # alone's GC runs at 0.9x its RSS. Only `spare` bytes (part of the
        # growth budget): where live objects keep growing, pools fall under
        # Ruby's free minimum later and need the rest.
        def balance(reading, short, free, profile, spare)
          objects = profile.objects
          total = objects.sum
          used = objects.each_index.select { |i| objects[i] >= [total * BALANCE_SHARE, 1].max }
          return short if used.size < 2

          held = held(free.each_index.map { |i| free[i] + short[i] }, objects)
          (pool, low), (_, next_low) = used.map { |i| [i, held[i]] }.min_by(2, &:last)
          level = next_low - 1
          level = [level, @malloc_limit_max.fdiv(profile.malloc)].min if profile.malloc.positive?
          return short unless level > low

          size = reading.fetch(:heaps).fetch(pool).fetch(:slot_size, BASE_SLOT_SIZE)
          cap = room(free[pool], lives(reading).fetch(pool)) - short[pool]
          slots = [((level - low) * objects[pool]).ceil, cap, spare / size].min
          return short unless slots.positive?

          short.dup.tap { |s| s[pool] += slots }
        end

        # Slots pool `index` (`heap`, `free` slots free after a GC) lacks to
        # keep Ruby's free minimum and one request (`need` slots) more.
        def floor(heap, index, free, need)
          ((slots_for_free_minimum(heap, index) * @min_free_ratio) + need - free).ceil
        end

        # Whether pool `index` takes `slots` more as pages with no GC (it
        # stays at most at its initial slots): grown by allocating there.
        def grows_freely?(reading, index, slots)
          slots <= below_init(reading.fetch(:heaps).fetch(index), index)
        end

        def valve?(reading)
          !@baseline.nil? && major_asked?(reading) && available(reading) > @baseline * @valve_ratio
        end

        # Share of the free slots a sweep hands out that it keeps back for the
        # incremental mark of a major: each sweep step pools pages until they
        # hold GC_INCREMENTAL_SWEEP_POOL_SLOT_COUNT (1,024) free slots, then
        # hands pages to allocation until GC_INCREMENTAL_SWEEP_SLOT_COUNT
        # (2,048) (gc_sweep_step), a third and what the last page of each
        # passes by. Measured on 3.4.11 with a major pending: 35-36% of the
        # 40-byte pool (bench/gc_pooled_share_probe.rb), 40% of the 80-byte
        # pool (bench/gc_pending_major_probe.rb). The larger errs towards a
        # GC early, not one inside a request.
        KEPT_SHARE = 0.4

        # Slots per pool out of the requests' reach until the next GC: Ruby
        # hands the pooled pages over at the sweep's end only where no major
        # is pending then (gc_sweep_finish), and a `:nofree` major turned down
        # (#major_asked?) stays pending until the next GC. On the "cache"
        # shape (3.4, Puma) a cycle in which Ruby asked for one ended in a GC
        # inside a request after 19 requests, where the free count said 28.
        def kept_back(reading)
          count, free = @swept_free
          return [] unless count == reading.fetch(:stat).fetch(:count) && turned_down?(reading)

          free.map { |f| (f * KEPT_SHARE).ceil }
        end

        private

        # After a major this process ran: the slots it freed that the minor
        # before it had marked (old garbage, and the young objects that died
        # since, which errs towards more majors), per object allocated since
        # the major before. Not from a major a worker ran before its profile
        # settled (Profile#settled?): in its first requests nothing they keep
        # has died yet, and an app whose objects live 20 requests ran one
        # major in 400 where it needed several (test/integration/oob_gc_test.rb).
        def found_garbage(stat)
          marked_before, allocated, settled = @major_from
          @major_from = nil
          if settled && marked_before && @allocated_at_major && allocated > @allocated_at_major
            freed = [marked_before - stat.fetch(:heap_marked_slots), 0].max
            @garbage_rate = freed.fdiv(allocated - @allocated_at_major)
          end
          @allocated_at_major = allocated
          @marked_after_minor = nil
        end

        # Objects allocated in all, less the collector's own (#allocated_aside).
        def allocated(reading) = reading.fetch(:stat).fetch(:total_allocated_objects) - @aside

        # Whether the old garbage expected by now (#found_garbage's rate)
        # would hold one request: a major that frees less does not put off
        # the next GC by one request.
        def worth_major?(reading)
          return true unless @objects

          expected = @garbage_rate * (allocated(reading) - @allocated_at_major)
          expected >= [@objects.sum, 1].max
        end

        # With full marks off Ruby asks for its majors itself
        # (need_major_by); growth keeps pools above its free minimum
        # (#growth_shortfall).
        def nofree_after(_kind, _reading); end

        # Adds to `plan` the slots that raise the pools holding the fewest
        # requests to one level, at most `cap` requests, within `left` (a
        # Left, which it takes from). Bisects the level: a pool at `held`
        # requests takes (level - held) requests' slots, up to what it is
        # `short`.
        def level(plan, cap, held, objects, short, sizes, left)
          take = lambda do |lvl|
            short.each_index.map do |i|
              need = objects.fetch(i, 0)
              next 0 unless need.positive? && held[i] < lvl

              [[((lvl - held[i]) * need).floor, short[i]].min - plan[i], 0].max
            end
          end
          fits = lambda do |slots|
            slots.each_with_index.sum { |n, i| n * sizes[i] } <= left.bytes && slots.sum <= left.slots
          end
          low = held.min
          high = short.each_index.map do |i|
            objects.fetch(i, 0).positive? ? held[i] + short[i].fdiv(objects[i]) : 0
          end.max
          high = [high, cap].min
          return if high <= low

          if fits.(take.(high))
            low = high
          else
            40.times do
              mid = (low + high) / 2
              fits.(take.(mid)) ? low = mid : high = mid
            end
          end
          slots = take.(low)
          slots.each_index do |i|
            plan[i] += slots[i]
            left.take(slots[i], sizes[i])
          end
        end

        # `reading` without the shared allocatable slots, which the next GC
        # that allocation did not start sets back to zero.
        def own(reading) = reading.merge(stat: reading.fetch(:stat).merge(heap_allocatable_slots: 0))

        def available(reading) = reading.fetch(:stat).fetch(:heap_available_slots)

        # A pool smaller than its initial slots must keep 20% of those free
        # (gc_sweep_finish_heap), or it asks for a `:nofree` major at the
        # third minor after each major: on the Rails bench app, the 640-byte
        # pool (1,624 slots, 85% of them free) asked every fourth GC.
        def slots_for_free_minimum(heap, index) = [heap.fetch(:heap_eden_slots), init_slots(index)].max

        def init_slots(index) = @init_slots.fetch(index, INIT_SLOTS)

        # Slots pool `index` (`heap`) may still take as pages with no GC.
        def below_init(heap, index) = [init_slots(index) - heap.fetch(:heap_eden_slots), 0].max
      end
    end
  end
end
