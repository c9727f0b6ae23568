# frozen_string_literal: true

require "test_helper"
require "memkit/oob_gc"

# The policies decide from readings alone, so these feed made-up GC.stat
# hashes and request profiles: no GC runs here.
class OobGCPolicyTest < Minitest::Test
  Policy = Memkit::OobGC::Policy
  Profile = Memkit::OobGC::Profile
  PAGE = 409 # slots per page on Ruby 3.1

  # One heap (3.1): free/eden/allocatable in slots, the rest as GC.stat names them.
  def one_heap(free:, eden: 400_000, allocatable: 0, count: 10, majors: 2, allocated: 1_000_000, marked: nil,
               old: 50_000, old_limit: 200_000, malloc: 0, malloc_limit: 16 << 20, oldmalloc: 0,
               oldmalloc_limit: 16 << 20, state: :none, need_major_by: nil, **extra)
    stat = { count: count, major_gc_count: majors, minor_gc_count: count - majors, heap_free_slots: free,
             heap_eden_pages: eden / PAGE, heap_allocatable_pages: allocatable / PAGE,
             heap_available_slots: eden, heap_tomb_pages: 0, heap_live_slots: eden - free,
             heap_marked_slots: marked || (eden - free), total_allocated_objects: allocated, old_objects: old,
             old_objects_limit: old_limit, malloc_increase_bytes: malloc, malloc_increase_bytes_limit: malloc_limit,
             oldmalloc_increase_bytes: oldmalloc, oldmalloc_increase_bytes_limit: oldmalloc_limit,
             remembered_wb_unprotected_objects: 0, remembered_wb_unprotected_objects_limit: 1_000 }.merge(extra)
    # Ruby 3.1's latest_gc_info has no need_major_by.
    info = { state: state }
    info[:need_major_by] = need_major_by if need_major_by
    { stat: stat, heaps: nil, info: info }
  end

  # Size pools (3.2+): pools is [[eden slots, live, allocatable pages], ...].
  def pooled(pools, need_major_by: nil, shared_allocatable: nil, available: nil, state: nil, **stat)
    heaps = pools.each_with_index.map do |(slots, live, allocatable), i|
      { slot_size: 40 << i, heap_eden_slots: slots, heap_eden_pages: [slots / (1638 >> i), 1].max,
        total_allocated_objects: 1_000_000 + live, total_freed_objects: 1_000_000,
        heap_allocatable_pages: allocatable.to_i }
    end
    base = { count: 10, major_gc_count: 2, old_objects: 10_000, old_objects_limit: 100_000,
             malloc_increase_bytes: 0, malloc_increase_bytes_limit: 16 << 20, oldmalloc_increase_bytes: 0,
             oldmalloc_increase_bytes_limit: 16 << 20, heap_available_slots: available || pools.sum(&:first),
             heap_marked_slots: pools.sum { |_, live| live } }
    base[:heap_allocatable_slots] = shared_allocatable if shared_allocatable
    { stat: base.merge(stat), heaps: heaps, info: { need_major_by: need_major_by, state: state } }
  end

  # `requests` requests of `objects` per pool, and one with `beyond` more
  # in each pool they use (the largest request learned: Policy#reserve's
  # slack).
  def profile(objects, malloc: 0, requests: 20, beyond: Policy::SLACK)
    p = Profile.new
    objects = Array(objects)
    requests.times { p.record(objects, malloc) }
    p.record(objects.map { |n| n.positive? ? n + beyond : 0 }, malloc) if beyond.positive?
    p
  end

  # The bench Rails app on 3.3: objects per request per pool, and its pools
  # with `live2` objects in the 160-byte pool's 45,800 slots.
  def rails_profile = profile([10_000, 0, 2_900])

  def rails_pools(live2, **options) = pooled([[200_000, 100_000], [50_000, 10_000], [45_800, live2]], **options)

  def test_nothing_is_due_before_a_request_has_been_seen
    assert_nil Policy::OneHeap.new(page_slots: PAGE).decide(one_heap(free: 0), Profile.new)
  end

  def test_one_heap_collects_when_the_next_request_would_not_fit
    policy = Policy::OneHeap.new(page_slots: PAGE, headroom: 1.1)
    req = profile(50_000)
    assert_nil policy.decide(one_heap(free: 57_000), req) # 1.1 requests and SLACK
    assert_equal :minor, policy.decide(one_heap(free: 54_000), req)
    # Pages Ruby may still add without collecting count as free.
    assert_nil policy.decide(one_heap(free: 10_000, allocatable: 120 * PAGE), req)
  end

  def test_malloc_growth_near_its_limit_is_due
    policy = Policy::OneHeap.new(page_slots: PAGE, malloc_limit_max: 32 << 20)
    req = profile(1_000, malloc: 4 << 20)
    assert_nil policy.decide(one_heap(free: 300_000, malloc: 16 << 20, malloc_limit: 24 << 20), req)
    assert_equal :minor, policy.decide(one_heap(free: 300_000, malloc: 20 << 20, malloc_limit: 24 << 20), req)
    # At a limit still low too: the collector overruns it as Ruby would
    # (Collector#overrun_malloc), which raises it.
    assert_equal :minor, policy.decide(one_heap(free: 300_000, malloc: 12 << 20, malloc_limit: 16 << 20), req)
    assert_nil policy.decide(one_heap(free: 300_000, malloc: 11 << 20, malloc_limit: 16 << 20), req)
  end

  # "malloc" shape: 8 MB malloc'd a request, pools roomy. The GC due is for
  # malloc alone (the collector then lets Ruby run it for the overrun, which
  # raises the limit), at any limit; with a pool short too, it is not.
  def test_malloc_due_only_when_the_pools_hold_the_next_request
    policy = Policy::SizePools.new(malloc_limit_max: 32 << 20)
    req = profile([3_600, 300], malloc: 8 << 20)
    roomy = [[600_000, 500_000], [80_000, 70_000]]
    assert policy.malloc_due?(pooled(roomy, malloc_increase_bytes: 16 << 20, malloc_increase_bytes_limit: 24 << 20),
                              req)
    refute policy.malloc_due?(pooled(roomy, malloc_increase_bytes: 8 << 20, malloc_increase_bytes_limit: 24 << 20),
                              req), "the next request fits under the limit"
    assert policy.malloc_due?(pooled(roomy, malloc_increase_bytes: 9 << 20, malloc_increase_bytes_limit: 16 << 20),
                              req), "a limit at its minimum"
    short = [[600_000, 500_000], [80_000, 79_800]]
    refute policy.malloc_due?(pooled(short, malloc_increase_bytes: 16 << 20, malloc_increase_bytes_limit: 24 << 20),
                              req), "a pool is short too: a GC.start minor"
    assert_nil policy.decide(pooled(roomy), req)
  end

  # Ruby 3.3+: while a major Ruby asked for is pending, Ruby adds no page and
  # keeps back the pages its sweep pooled for the major's marking, so slots
  # that look free are not room: the major is due now.
  def test_a_major_ruby_asked_for_is_due_whatever_the_pools_show
    policy = Policy::SizePools.new
    req = profile([2_000, 200])
    roomy = [[100_000, 50_000], [10_000, 8_000]]
    assert_nil policy.decide(pooled(roomy), req)
    assert_equal :major, policy.decide(pooled(roomy, need_major_by: :oldmalloc), req)
    assert_nil policy.margins(pooled(roomy, need_major_by: :oldmalloc), req), "nothing to wait for"
  end

  def test_major_when_ruby_has_one_pending
    policy = Policy::OneHeap.new(page_slots: PAGE)
    req = profile(50_000)
    assert_equal :major, policy.decide(one_heap(free: 1_000, old: 200_000, old_limit: 200_000), req)
    assert_equal :major, policy.decide(one_heap(free: 1_000, need_major_by: :nofree), req)
    # Oldmalloc past its limit is not a pending major: Ruby has not asked
    # for one, and a major it did not ask for lowers the limit.
    assert_equal :minor, policy.decide(one_heap(free: 1_000, oldmalloc: (16 << 20) + 1), req)
    # Nothing is run for a pending major while the next request still fits.
    assert_nil policy.decide(one_heap(free: 300_000, old: 200_000, old_limit: 200_000), req)
  end

  # Where Ruby says whether it asked for a major (3.3+), its word wins over
  # the reading before the minor: that minor's sweep of the last GC may
  # have freed enough to bring oldmalloc back under its limit.
  def test_no_major_after_an_oldmalloc_overrun_ruby_did_not_ask_about
    policy = Policy::SizePools.new
    policy.collecting(pooled([[100_000, 99_500]], oldmalloc_increase_bytes: 20 << 20), :minor)
    refute policy.major_next?(pooled([[100_000, 40_000]], oldmalloc_increase_bytes: 15 << 20))
  end

  # During a lazy sweep heap_free_slots counts only the swept pages; the
  # mark says what the sweep will free.
  # Ruby raises the oldmalloc limit only at a minor GC that finds it
  # overrun, and then asks for a major: the policy runs that minor, then
  # the major Ruby asked for (Ruby 3.1 does not say it asked: the policy
  # knows from the reading before the minor).
  def test_oldmalloc_overrun_is_a_minor_then_the_major_ruby_asks_for
    [Policy::OneHeap.new(page_slots: PAGE), Policy::SizePools.new].each do |policy|
      over = if policy.is_a?(Policy::OneHeap)
               one_heap(free: 1_000, oldmalloc: 20 << 20, oldmalloc_limit: 16 << 20)
             else
               pooled([[100_000, 99_500]], oldmalloc_increase_bytes: 20 << 20)
             end
      req = profile(policy.is_a?(Policy::OneHeap) ? 50_000 : [50_000])
      assert_equal :minor, policy.decide(over, req)
      assert policy.oldmalloc_over?(over)
      policy.collecting(over, :minor)
      after = if policy.is_a?(Policy::OneHeap)
                one_heap(free: 300_000, marked: 100_000, oldmalloc: 20 << 20, oldmalloc_limit: 19 << 20, count: 11)
              else
                # Ruby 3.3+ says it asked.
                pooled([[100_000, 40_000]], oldmalloc_increase_bytes: 20 << 20,
                                            oldmalloc_increase_bytes_limit: 19 << 20, need_major_by: :oldmalloc)
              end
      assert policy.major_next?(after), policy.name
      policy.collecting(after, :major)
      settled = if policy.is_a?(Policy::OneHeap)
                  one_heap(free: 300_000, marked: 100_000, count: 12)
                else
                  pooled([[100_000, 40_000]])
                end
      refute policy.major_next?(settled), "#{policy.name}: the major settled it"
    end
    # Ruby 3.3+ says so itself.
    policy = Policy::NoFullMark.new
    assert policy.major_next?(pooled([[100_000, 40_000]], need_major_by: :oldmalloc))
    assert_equal :major, policy.decide(pooled([[100_000, 40_000]], need_major_by: :oldmalloc), profile([1_000]))
    # Slots short or not with full marks off: Ruby runs no minor of its own
    # that would find the overrun.
    roomy = pooled([[500_000, 40_000]], oldmalloc_increase_bytes: 20 << 20)
    assert_equal :minor, policy.decide(roomy, profile([1_000]))
    assert_nil policy.margins(roomy, profile([1_000]))
    margins = policy.margins(pooled([[500_000, 40_000]], oldmalloc_increase_bytes: 10 << 20), profile([1_000]))
    assert_equal 6 << 20, margins.malloc
    # Where Ruby runs its own majors it finds the overrun at its next GC.
    assert_nil Policy::SizePools.new.decide(roomy, profile([1_000]))
  end

  def test_lazy_sweep_reads_free_slots_from_the_mark
    policy = Policy::OneHeap.new(page_slots: PAGE)
    after_gc = one_heap(free: 5_000, marked: 150_000, allocated: 2_000_000, state: :sweeping, count: 11)
    policy.collected(:minor, after_gc)
    assert_equal [400_000 - 150_000], policy.free(after_gc)
    later = one_heap(free: 5_000, marked: 150_000, allocated: 2_100_000, state: :sweeping, count: 11)
    assert_equal [400_000 - 150_000 - 100_000], policy.free(later)
    assert_equal [5_000], policy.free(one_heap(free: 5_000, count: 11)), "sweep over: the count is right"
  end

  # Pages hold 408 or 409 slots: the heap's slots are what GC.stat counts,
  # not its pages times 409, less its tomb pages' at most 409 each.
  def test_lazy_sweep_counts_the_slots_the_pages_hold
    policy = Policy::OneHeap.new(page_slots: PAGE)
    pages = { heap_eden_pages: 3_280, heap_tomb_pages: 2, heap_available_slots: 3_282 * 408 }
    after_gc = one_heap(free: 400, marked: 800_000, allocated: 5_000_000, state: :sweeping, count: 39, **pages)
    policy.collected(:minor, after_gc)
    later = one_heap(free: 400, marked: 800_000, allocated: 5_530_000, state: :sweeping, count: 39, **pages)
    assert_equal [(3_282 * 408) - (2 * PAGE) - 800_000 - 530_000], policy.free(later)
  end

  # A minor that would leave the heap short of Ruby's free minimum would be
  # followed at once by a major: the policy runs the major alone.
  def test_one_heap_runs_the_major_alone_where_a_minor_would_fill_the_heap
    policy = Policy::OneHeap.new(page_slots: PAGE)
    req = profile(40_000)
    policy.collecting(one_heap(free: 0, old: 100_000, count: 20, majors: 2))
    policy.collected(:minor, one_heap(free: 200_000, marked: 130_000, old: 100_000, count: 21, majors: 2))
    # 100k old + 30k survivors of 400k: plenty left free.
    assert_equal :minor, policy.decide(one_heap(free: 30_000, old: 100_000, count: 21, majors: 2), req)
    # 300k old + 30k survivors: less than 20% free.
    assert_equal :major, policy.decide(one_heap(free: 30_000, old: 300_000, count: 21, majors: 2), req)
  end

  def test_one_heap_major_next_unless_ruby_would_grow_the_heap_instead
    policy = Policy::OneHeap.new(page_slots: PAGE)
    policy.collected(:major, one_heap(free: 100_000, count: 20, majors: 3))
    full = ->(count) { one_heap(free: 10_000, marked: 390_000, count: count, majors: 3) }
    refute policy.major_next?(full.call(21)), "within 3 GCs of a major Ruby grows the heap"
    assert policy.major_next?(full.call(24))
    refute policy.major_next?(one_heap(free: 200_000, marked: 200_000, count: 24, majors: 3))
  end

  # Ruby 3.1 sets SHADY/OLDGEN at a minor's mark without saying so; GC.stat
  # shows the counts past their limits. Until that major runs Ruby takes no
  # allocatable pages, so they are not room, and the major is due when the
  # eden pages cannot hold the next request.
  def test_one_heap_pending_major_leaves_out_the_allocatable_pages
    policy = Policy::OneHeap.new(page_slots: PAGE)
    req = profile(50_000)
    shady = { remembered_wb_unprotected_objects: 1_000, remembered_wb_unprotected_objects_limit: 1_000 }
    assert_nil policy.decide(one_heap(free: 30_000, allocatable: 100 * PAGE), req)
    assert_equal [30_000], policy.free(one_heap(free: 30_000, allocatable: 100 * PAGE, **shady))
    assert_equal :major, policy.decide(one_heap(free: 30_000, allocatable: 100 * PAGE, **shady), req)
    assert_equal :major, policy.decide(one_heap(free: 30_000, old: 200_000, allocatable: 100 * PAGE), req)
  end

  # Right after the out-of-band minor that set the flag, the major runs in
  # the same pause: left for later, it started inside requests.
  def test_one_heap_major_next_when_the_minor_set_shady_or_oldgen
    policy = Policy::OneHeap.new(page_slots: PAGE)
    shady = { remembered_wb_unprotected_objects: 1_000, remembered_wb_unprotected_objects_limit: 1_000 }
    assert policy.major_next?(one_heap(free: 200_000, allocatable: 100 * PAGE, **shady))
    assert policy.major_next?(one_heap(free: 200_000, old: 200_000, old_limit: 200_000))
    refute policy.major_next?(one_heap(free: 200_000, allocatable: 100 * PAGE))
  end

  # A minor whose mark would take the shady (or old) objects past their
  # limit, growing as much as at the last minor, would set the flag: the
  # major runs in its place.
  def test_one_heap_runs_the_major_alone_where_a_minor_would_set_shady
    policy = Policy::OneHeap.new(page_slots: PAGE)
    req = profile(40_000)
    shady = ->(n) { { remembered_wb_unprotected_objects: n, remembered_wb_unprotected_objects_limit: 1_000 } }
    policy.collecting(one_heap(free: 0, old: 100_000, **shady.call(800)))
    policy.collected(:minor, one_heap(free: 200_000, marked: 130_000, old: 100_000, count: 11, **shady.call(900)))
    assert_equal :minor, policy.decide(one_heap(free: 30_000, old: 100_000, count: 11, **shady.call(900)), req)
    assert_equal :major, policy.decide(one_heap(free: 30_000, old: 100_000, count: 11, **shady.call(950)), req)
    # Old objects: 20k promoted at the last minor, 190k of a 200k limit now.
    policy.collecting(one_heap(free: 0, old: 100_000, count: 11, **shady.call(0)))
    policy.collected(:minor, one_heap(free: 200_000, marked: 150_000, old: 120_000, count: 12, **shady.call(0)))
    assert_equal :major, policy.decide(one_heap(free: 30_000, old: 190_000, count: 12, **shady.call(0)), req)
    assert_equal :minor, policy.decide(one_heap(free: 30_000, old: 170_000, count: 12, **shady.call(0)), req)
  end

  # Policy#major_due?: a pending major runs in the same pause where the next
  # request would not fit before it.
  def test_major_due_after_a_minor_only_where_the_next_request_would_not_fit
    policy = Policy::OneHeap.new(page_slots: PAGE)
    req = profile(50_000)
    shady = { remembered_wb_unprotected_objects: 1_000, remembered_wb_unprotected_objects_limit: 1_000 }
    assert policy.major_due?(one_heap(free: 30_000, allocatable: 100 * PAGE, **shady), req)
    refute policy.major_due?(one_heap(free: 200_000, allocatable: 100 * PAGE, **shady), req)
    refute policy.major_due?(one_heap(free: 30_000, allocatable: 100 * PAGE), req), "no major pending"
    refute policy.major_due?(one_heap(free: 30_000, **shady), Profile.new), "nothing learned yet"
  end

  # Ruby 3.3 asks for a major (NOFREE) at the end of a pool's sweep only if
  # the sweep freed more than it found free; an out-of-band minor runs with
  # the next request's room still free, so Ruby does not ask. The policy
  # applies Ruby's test to the room the next cycle can use: the 160-byte pool
  # of bench/rails on 3.3, whose minors keep old garbage.
  def test_size_pools_a_minor_leaving_a_pool_short_makes_the_next_gc_major
    req = rails_profile
    policy = Policy::SizePools.new
    policy.decide(rails_pools(14_500), req)
    policy.collected(:major, rails_pools(14_500, count: 10, major_gc_count: 3))
    # 9,000 free less the 4,190 kept for the next request: under 20% of 45,800.
    policy.collected(:minor, rails_pools(36_800, count: 12, major_gc_count: 3))
    refute policy.major_pending?(rails_pools(36_800, count: 12)), "within 3 GCs of a major Ruby grows"
    assert_equal :minor, policy.decide(rails_pools(42_000, count: 12), req)
    policy.collected(:minor, rails_pools(36_800, count: 13, major_gc_count: 3))
    assert policy.major_pending?(rails_pools(36_800, count: 13))
    assert_nil policy.decide(rails_pools(36_800, count: 13), req), "due only when the pool is short"
    assert_equal :major, policy.decide(rails_pools(42_000, count: 13), req)
    refute policy.major_due?(rails_pools(36_800, count: 13), req), "the next request fits: not at once"
    assert policy.major_due?(rails_pools(42_000, count: 13), req)
    # Any GC since (Ruby's own) settles it.
    assert_equal :minor, policy.decide(rails_pools(42_000, count: 14), req)
    # Room enough after the minor: nothing pending.
    policy.collected(:minor, rails_pools(25_000, count: 15, major_gc_count: 3))
    refute policy.major_pending?(rails_pools(25_000, count: 15))
    # Mid-sweep the free counts are not final: no verdict.
    policy.collected(:minor, rails_pools(36_800, count: 16, major_gc_count: 3, state: :sweeping))
    refute policy.major_pending?(rails_pools(36_800, count: 16))
  end

  # A pool short because what it holds is live (a cache that grows) gains
  # nothing from majors: it needs growth (#shortfall), not majors.
  def test_size_pools_no_major_for_a_pool_full_of_live_objects
    req = rails_profile
    policy = Policy::SizePools.new
    policy.decide(rails_pools(36_000), req)
    policy.collected(:major, rails_pools(36_000, count: 10, major_gc_count: 3))
    policy.collected(:minor, rails_pools(36_800, count: 13, major_gc_count: 3))
    refute policy.major_pending?(rails_pools(36_800, count: 13))
    # A major Ruby ran, seen at a later reading, counts as the latest.
    policy.observe(rails_pools(20_000, count: 14, major_gc_count: 3))
    policy.observe(rails_pools(20_000, count: 15, major_gc_count: 4))
    policy.collected(:minor, rails_pools(36_800, count: 17, major_gc_count: 4))
    refute policy.major_pending?(rails_pools(36_800, count: 17)), "within 3 GCs of Ruby's major"
    policy.collected(:minor, rails_pools(36_800, count: 18, major_gc_count: 4))
    assert policy.major_pending?(rails_pools(36_800, count: 18))
  end

  # Ruby grows a pool its own GC leaves short within 3 GCs of a major, or
  # where a major would not give the room back; after an out-of-band GC,
  # which leaves the pool its room, Ruby grows nothing, so the heap's
  # sizing does. 200,000 free less the 12,000 kept for the next request:
  # 12,000 under 20% of the pool, which `want` alone (11 x 12,000) finds
  # roomy.
  def test_size_pools_grow_a_pool_ruby_would_grow_after_its_own_gc
    req = profile([10_000])
    policy = Policy::SizePools.new
    at = ->(live, count) { pooled([[1_000_000, live]], count: count, major_gc_count: 3) }
    policy.decide(at.(790_000, 9), req)
    policy.collected(:major, at.(600_000, 10))
    assert_equal [12_000], policy.below_minimum(at.(800_000, 11)), "within 3 GCs of a major"
    assert_equal [12_000], policy.shortfall(at.(800_000, 11), req, cover: 2.1, want: 10)
    assert_equal [0], policy.shortfall(at.(800_000, 11), req, cover: 2.1), "it holds the next requests"
    refute policy.nofree?(at.(800_000, 11))
    # Later, live objects that grew 200,000 since the major: the major
    # gives the room back, and Ruby would run it instead.
    assert policy.nofree?(at.(800_000, 14))
    assert_equal [0], policy.below_minimum(at.(800_000, 14))
    assert_equal [0], policy.shortfall(at.(800_000, 14), req, cover: 2.1, want: 10), "the major's room"
    assert_equal [0], policy.below_minimum(at.(780_000, 11)), "at the minimum"
    # Above it by less than a request's reserve: the sizing grows the pool
    # clear of it, where Ruby's next GC would be a major or a growth.
    assert_equal [4_000], policy.clearance(at.(780_000, 11))
    assert_equal [4_000], policy.shortfall(at.(780_000, 11), req, cover: 2.1, want: 10)
    assert_equal [0], policy.clearance(at.(770_000, 11)), "a reserve clear"
    assert_equal [0], policy.shortfall(at.(770_000, 11), req, cover: 2.1, want: 10)

    # A cache that keeps what it allocates: a major gives nothing back.
    policy.collected(:major, at.(795_000, 20))
    assert_equal [12_000], policy.below_minimum(at.(800_000, 24))
    refute policy.nofree?(at.(800_000, 24))
    assert_nil Policy::SizePools.new.below_minimum(at.(800_000, 24)), "no request learned"
  end

  # Two pools of 100,000 slots; `counts` is [[allocated, freed], ...] per pool.
  def sweep_reading(counts, count:, marked: 0, state: :sweeping)
    heaps = counts.each_with_index.map do |(allocated, freed), i|
      { slot_size: 40 << i, heap_eden_slots: 100_000, heap_eden_pages: 100_000 / (1638 >> i),
        total_allocated_objects: allocated, total_freed_objects: freed }
    end
    stat = { count: count, major_gc_count: 2, heap_marked_slots: marked, old_objects: 10_000,
             old_objects_limit: 100_000, oldmalloc_increase_bytes: 0, oldmalloc_increase_bytes_limit: 16 << 20 }
    { stat: stat, heaps: heaps, info: { state: state } }
  end

  # Mid-sweep of an out-of-band minor, each pool's garbage is what it
  # allocated since the last mark less every survivor of all the pools:
  # the free count errs low, never high.
  def test_size_pools_read_free_slots_mid_sweep_from_an_estimate_that_errs_low
    policy = Policy::SizePools.new
    policy.collected(:minor, sweep_reading([[50_000, 0], [20_000, 0]], count: 5, state: :none))
    refute policy.reads_sweep?(sweep_reading([[90_000, 0], [30_000, 0]], count: 5), :minor, 9),
           "GCs closer than SPREAD requests sweep at once"
    refute policy.reads_sweep?(sweep_reading([[90_000, 0], [30_000, 0]], count: 5), :major, 20)
    refute policy.reads_sweep?(sweep_reading([[90_000, 0], [30_000, 0]], count: 6), :minor, 20),
           "a GC of Ruby's since: what each pool allocated since a mark is not known"
    before = sweep_reading([[90_000, 0], [30_000, 0]], count: 5, state: :none)
    assert policy.reads_sweep?(before, :minor, 20)
    # 40,000 and 10,000 allocated since; 70,000 live at the mark, so 50,000
    # occupied slots less 2,000 survivors are garbage, unswept yet.
    policy.collecting(before)
    after = sweep_reading([[90_000, 0], [30_000, 0]], count: 6, marked: 72_000)
    policy.collected(:minor, after)
    assert policy.lazy_sweep?(after)
    assert_equal [100_000 - 90_000 + 38_000, 100_000 - 30_000 + 8_000], policy.free(after)
    assert_equal [52_000, 22_000], policy.lives(after)
    # The sweep frees what it finds; requests allocate: only those count.
    later = sweep_reading([[95_000, 20_000], [31_000, 8_000]], count: 6, marked: 72_000)
    assert_equal [100_000 - 95_000 + 20_000 + 18_000, 100_000 - 31_000 + 8_000], policy.free(later)
    done = sweep_reading([[95_000, 39_000], [31_000, 9_000]], count: 6, state: :none)
    refute policy.lazy_sweep?(done)
    assert_equal [44_000, 78_000], policy.free(done), "sweep over: the counts are right"
    # The next GC is Ruby's: no estimate for its sweep.
    assert_equal [5_000, 69_000], policy.free(sweep_reading([[95_000, 0], [31_000, 0]], count: 7))
  end

  # After a major (old garbage too) nothing is estimated.
  def test_size_pools_no_estimate_after_a_major
    policy = Policy::SizePools.new
    policy.collected(:minor, sweep_reading([[50_000, 0], [20_000, 0]], count: 5, state: :none))
    policy.collecting(sweep_reading([[90_000, 0], [30_000, 0]], count: 5, state: :none), :major)
    after = sweep_reading([[90_000, 0], [30_000, 0]], count: 6, marked: 40_000)
    policy.collected(:major, after)
    refute policy.lazy_sweep?(after)
    assert_equal [10_000, 70_000], policy.free(after)
  end

  # Ruby 3.4 with full marks off grows pools its own way (NoFullMark).
  def test_no_full_mark_leaves_short_pools_to_growth
    req = rails_profile
    policy = Policy::NoFullMark.new
    policy.decide(rails_pools(14_500), req)
    policy.collected(:major, rails_pools(14_500, count: 10))
    policy.collected(:minor, rails_pools(36_800, count: 13))
    refute policy.major_pending?(rails_pools(36_800, count: 13))
  end

  def test_size_pools_any_pool_running_dry_is_due
    policy = Policy::SizePools.new(headroom: 1.0)
    req = profile([10_000, 5_000, 1_000])
    assert_nil policy.decide(pooled([[100_000, 50_000], [50_000, 40_000], [20_000, 10_000]]), req)
    assert_equal :minor, policy.decide(pooled([[100_000, 50_000], [50_000, 46_000], [20_000, 10_000]]), req)
    # Allocatable pages of the short pool count (3.3).
    assert_nil policy.decide(pooled([[100_000, 50_000], [50_000, 46_000, 10], [20_000, 10_000]]), req)
    # 3.4: one shared count of allocatable base-size slots; pool 1 slots are 80 bytes.
    tight = [[100_000, 50_000], [50_000, 46_000], [20_000, 10_000]]
    assert_nil policy.decide(pooled(tight, shared_allocatable: 4_000), req)
    assert_equal :minor, policy.decide(pooled(tight, shared_allocatable: 1_000), req)
  end

  # A small pool that runs dry every few requests while the main pool holds
  # many sets the GC rate: it is grown to hold as many requests as the main
  # one, and a pool with next to no allocation does not set the target.
  def test_size_pools_grow_the_pool_that_runs_dry_first
    policy = Policy::SizePools.new
    req = profile([26_000, 1, 2_000])
    reading = pooled([[400_000, 165_000], [50_000, 10_000], [20_000, 11_000]])
    short = policy.shortfall(reading, req, cover: 2.1)
    assert_equal 0, short[0], "the main pool holds 9 requests"
    assert_equal 0, short[1]
    assert_in_delta (2_000 * 235_000 / 26_000.0) - 9_000, short[2], 1
  end

  # Sized for `want`, each pool holds want + 1 times the free slots at which
  # the policy collects, so that the collector, collecting with `reserve`
  # left, runs at most (want + 1) / want times the GCs of Ruby alone at the
  # same heap, which collects with none left. The Rails bench app on 3.4: its
  # 80-byte pool, 1,448 objects at the percentile and a reserve of 2,593
  # slots, held 24,500 free after a GC, 10 of its 1.45-MB requests at the
  # percentile, and collected 1.18x Ruby's runs.
  def test_want_sizes_each_pool_for_its_reserve
    policy = Policy::SizePools.new(headroom: 1.1)
    req = profile([5_450, 1_448, 2_735])
    after_gc = pooled([[258_000, 155_000], [53_000, 28_500], [60_000, 15_000]])
    short = policy.shortfall(after_gc, req, cover: 2.1, want: 10)
    reserve = [5_450, 1_448, 2_735].map { |need| (need * 1.1) + [1_000, need].min }
    free = [103_000, 24_500, 45_000]
    expected = reserve.zip(free).map { |r, f| [(11 * r).ceil - f, 0].max }
    assert_equal expected, short
    assert_equal [0, 4_021, 0], short
    # At that size the collector, collecting with `reserve` left, runs at
    # most 1.1 times Ruby's GCs.
    grown = pooled([[258_000, 155_000], [53_000 + short[1], 28_500], [60_000, 15_000]])
    held = policy.free(grown).zip(reserve).map { |f, r| f / (f - r) }
    assert_operator held.max, :<=, 1.1
    # Without `want`, only `cover` (and the main pool's requests, balanced).
    assert_equal [0, 0, 0], policy.shortfall(after_gc, req, cover: 2.1)
  end

  # Ruby frees pages past 65% of the heap free: `want` is scaled down to
  # stay below that.
  def test_want_stays_below_the_free_share_ruby_gives_back
    policy = Policy::SizePools.new(headroom: 1.1)
    req = profile([50_000])
    after_gc = pooled([[200_000, 100_000]])
    short = policy.shortfall(after_gc, req, cover: 2.1, want: 10)
    assert_equal [50_000], short # 150,000 free at most for 100,000 live
  end

  # A pool a request uses for one object, with a few hundred free slots, is
  # not short: the slack beyond the learned request scales with it (on 3.4
  # a fixed slack collected after every request of bench's "cache" app).
  def test_a_pool_a_request_barely_uses_is_not_short
    policy = Policy::SizePools.new
    req = profile([15_000, 500, 2_000, 0, 1])
    reading = pooled([[500_000, 100_000], [20_000, 7_000], [60_000, 11_000], [1_000, 600], [1_000, 558]])
    assert_nil policy.decide(reading, req)
  end

  # Recorded on Ruby 3.4, "promoting" shape on Unicorn: a worker whose
  # one major came amid its first requests' promotions kept 200,000 old
  # objects more than one whose major came after them, and collected every
  # 22 requests where the other did every 34. The first GC due once the
  # profile has settled is a major; the ones after it are minors again.
  def test_no_full_mark_makes_the_first_gc_due_after_the_profile_settled_a_major
    policy = Policy::NoFullMark.new
    young = profile([15_000, 600], requests: 20)
    at = ->(live, **o) { pooled([[1_000_000, live], [100_000, 50_000]], total_allocated_objects: 9_000_000, **o) }
    short = at.(990_000)
    policy.observe(short)
    assert_equal :minor, policy.decide(short, young), "not settled yet: a minor"
    settled = profile([15_000, 600], requests: 40)
    assert_nil policy.decide(at.(500_000), settled), "nothing due: nothing run"
    assert_equal :major, policy.decide(short, settled)
    policy.collecting(short, :major)
    policy.collected(:major, at.(700_000, count: 11))
    assert_equal :minor, policy.decide(short, settled)
  end

  def test_no_full_mark_runs_the_major_as_soon_as_ruby_wants_one
    policy = Policy::NoFullMark.new
    req = profile([1_000, 1_000])
    roomy = pooled([[500_000, 100_000], [100_000, 10_000]])
    assert_nil policy.decide(roomy, req)
    assert_equal :major, policy.decide(pooled([[500_000, 100_000], [100_000, 10_000]], need_major_by: :oldgen), req)
    assert_equal :major, policy.decide(pooled([[500_000, 100_000], [100_000, 10_000]], old_objects: 100_000), req)
    assert_equal :major, policy.decide(pooled([[500_000, 100_000], [100_000, 10_000]], need_major_by: :nofree), req)
  end

  # Recorded on Ruby 3.4, "cache" shape behind Puma: Ruby asked for a
  # :nofree major every 120-150 requests and each freed almost nothing (the
  # cache's old objects are live). Once a major has found no old garbage,
  # a :nofree major is turned down until the garbage it found per object
  # allocated would hold one request; Ruby's other reasons run.
  def test_no_full_mark_turns_down_a_nofree_major_that_would_free_nothing
    policy = Policy::NoFullMark.new
    req = profile([10_000, 2_000], requests: 40)
    at = ->(allocated, live0, **o) { pooled([[1_000_000, live0], [400_000, 330_000]], total_allocated_objects: allocated, **o) }
    policy.observe(at.(10_000_000, 700_000))
    assert_nil policy.decide(at.(10_000_000, 700_000), req)
    policy.collected(:minor, at.(40_000_000, 700_000, heap_marked_slots: 1_030_000, count: 20))
    assert_equal :major, policy.decide(at.(41_000_000, 700_000, need_major_by: :nofree, count: 20), req),
                 "no major seen yet: Ruby's call"
    policy.collecting(at.(41_000_000, 700_000, count: 20), :major)
    policy.collected(:major, at.(41_000_000, 700_000, heap_marked_slots: 1_031_000, count: 21))

    asked = at.(60_000_000, 840_000, need_major_by: :nofree, count: 30)
    refute policy.major_asked?(asked)
    assert_nil policy.decide(asked, req), "the pools hold the next requests: nothing is due"
    assert policy.declined?(:nofree, 30)
    refute policy.declined?(:nofree, 31), "decided again after the next GC"
    refute policy.declined?(:oldgen, 30)
    assert_equal :major, policy.decide(at.(60_000_000, 700_000, need_major_by: :oldgen, count: 30), req)
    refute policy.valve?(at.(60_000_000, 840_000, need_major_by: :nofree, count: 30, heap_available_slots: 9_000_000))
  end

  # Ruby 3.4, "tiny" behind Puma: a :nofree major turned down, then the
  # minor run as Ruby's own by allocating fillers until a pool ran dry
  # (DryGrowth). The fillers die young: they do not bring the old garbage
  # that makes the major Ruby asks for again after that minor worth its pause.
  def test_no_full_mark_leaves_the_collectors_fillers_out_of_the_garbage_expected
    policy = Policy::NoFullMark.new
    req = profile([10_000, 2_000], requests: 40)
    at = ->(allocated, **o) { pooled([[1_000_000, 700_000], [400_000, 330_000]], total_allocated_objects: allocated, **o) }
    policy.observe(at.(10_000_000))
    assert_nil policy.decide(at.(10_000_000), req)
    policy.collected(:minor, at.(40_000_000, heap_marked_slots: 1_030_000, count: 20))
    policy.collecting(at.(41_000_000, count: 20), :major)
    policy.collected(:major, at.(41_000_000, heap_marked_slots: 1_000_000, count: 21))
    # 30,000 slots of old garbage in 31 million objects: a request's 12,000
    # objects' worth once 12.4 million more are allocated.
    refute policy.major_asked?(at.(50_000_000, need_major_by: :nofree, count: 30)), "9 million since"
    policy.allocated_aside(5_000_000)
    refute policy.major_asked?(at.(55_000_000, need_major_by: :nofree, count: 31)), "the fillers are no old garbage"
    assert policy.major_asked?(at.(59_000_000, need_major_by: :nofree, count: 32)), "13 million by requests"
  end

  # Recorded on Ruby 3.4, "cache" shape behind Puma: while a :nofree major
  # turned down is pending, Ruby's lazy sweep keeps over a third of what it
  # frees for that major's incremental mark, out of the requests' reach until the
  # next GC, and the cycle ended in a GC inside a request 9 requests before
  # the free count said it would. The free count leaves that third out.
  def test_no_full_mark_leaves_out_what_the_sweep_keeps_back_for_a_major_turned_down
    policy = Policy::NoFullMark.new
    req = profile([5_000, 1_000], requests: 40)
    at = lambda do |counts, count:, marked: 0, state: :none, need: nil|
      sweep_reading(counts, count: count, marked: marked, state: state).tap do |r|
        r[:stat].merge!(total_allocated_objects: counts.sum(&:first), malloc_increase_bytes: 0,
                        malloc_increase_bytes_limit: 16 << 20, heap_available_slots: 200_000)
        r[:info][:need_major_by] = need
      end
    end
    # A major that found no old garbage: Ruby's next :nofree majors are turned down.
    policy.observe(at.([[10_000, 0], [5_000, 0]], count: 3))
    assert_nil policy.decide(at.([[50_000, 0], [20_000, 0]], count: 4), req)
    policy.collected(:minor, at.([[50_000, 0], [20_000, 0]], count: 4, marked: 60_000))
    policy.collecting(at.([[50_000, 0], [20_000, 0]], count: 4), :major)
    policy.collected(:major, at.([[50_000, 0], [20_000, 0]], count: 5, marked: 60_000))
    # An out-of-band minor swept lazily: 38,000 and 8,000 slots of garbage
    # (see test_size_pools_read_free_slots_mid_sweep_from_an_estimate_that_errs_low).
    policy.collecting(at.([[90_000, 0], [30_000, 0]], count: 5))
    policy.collected(:minor, at.([[90_000, 0], [30_000, 0]], count: 6, marked: 72_000, state: :sweeping))
    mid = ->(need) { at.([[95_000, 20_000], [31_000, 8_000]], count: 6, marked: 72_000, state: :sweeping, need: need) }
    assert_equal [43_000, 77_000], policy.free(mid.(nil))

    asked = mid.(:nofree)
    assert_nil policy.decide(asked, req)
    assert policy.declined?(:nofree, 6)
    # 40% of the 48,000 and 78,000 slots the sweep hands out, all told.
    assert_equal [43_000 - 19_200, 77_000 - 31_200], policy.free(asked)
    done = at.([[95_000, 39_000], [31_000, 9_000]], count: 6, need: :nofree)
    assert_equal [44_000 - 19_200, 78_000 - 31_200], policy.free(done), "kept back past the sweep's end"
    assert_equal [5_000, 69_000], policy.free(at.([[95_000, 0], [31_000, 0]], count: 7, need: :nofree)),
                 "the next GC: nothing kept back that this knows of"
    refute policy.declined?(:oldgen, 6)
    assert_equal [43_000, 77_000], policy.free(mid.(:oldgen)), "a major that runs: the sweep ends before it"
  end

  def test_no_full_mark_runs_a_nofree_major_once_its_old_garbage_would_hold_a_request
    req = profile([10_000, 2_000], requests: 40)
    # 200,000 slots of old garbage in 10M objects allocated: 2%.
    policy = no_full_mark_after_major(req, marked_before: 1_230_000, marked_after: 1_030_000)
    assert_nil policy.decide(allocated_by(20_000_000, count: 21), req)
    refute policy.major_asked?(allocated_by(20_500_000, need_major_by: :nofree, count: 30)), "10,000 expected by now"
    assert policy.major_asked?(allocated_by(20_700_000, need_major_by: :nofree, count: 31)), "14,000: a request's 12,000"
  end

  # A worker's first majors come before anything it keeps has died: one
  # that freed nothing then says nothing of the requests after.
  def test_no_full_mark_learns_nothing_from_a_major_before_the_profile_settled
    young = profile([10_000, 2_000], requests: 20)
    policy = no_full_mark_after_major(young, marked_before: 1_230_000, marked_after: 1_230_000)
    assert policy.major_asked?(allocated_by(40_000_000, need_major_by: :nofree, count: 30))
  end

  # Two pools (900,000 and 330,000 live) with `allocated` objects allocated so far.
  def allocated_by(allocated, **stat)
    pooled([[1_000_000, 900_000], [400_000, 330_000]], total_allocated_objects: allocated, **stat)
  end

  # A NoFullMark policy that has decided with `profile`, then run a minor
  # that marked `marked_before` slots and a major right after it that marked
  # `marked_after`, 10M objects allocated in between.
  def no_full_mark_after_major(profile, marked_before:, marked_after:)
    policy = Policy::NoFullMark.new
    policy.observe(allocated_by(10_000_000))
    assert_nil policy.decide(allocated_by(10_000_000), profile)
    policy.collected(:minor, allocated_by(20_000_000, heap_marked_slots: marked_before, count: 20))
    policy.collecting(allocated_by(20_000_000, count: 20), :major)
    policy.collected(:major, allocated_by(20_000_000, heap_marked_slots: marked_after, count: 21))
    policy
  end

  def test_no_full_mark_valve_past_twice_the_heap_at_the_last_major
    policy = Policy::NoFullMark.new(valve_ratio: 2.0)
    policy.collected(:major, pooled([[100_000, 50_000]], available: 100_000))
    refute policy.valve?(pooled([[200_000, 150_000]], available: 200_000, need_major_by: :oldgen))
    assert policy.valve?(pooled([[200_001, 150_000]], available: 200_001, need_major_by: :oldgen))
    refute policy.valve?(pooled([[200_001, 150_000]], available: 200_001)), "no major asked for: Ruby's own growth"
    policy.collected(:major, pooled([[200_001, 150_000]], available: 200_001))
    refute policy.valve?(pooled([[200_001, 150_000]], available: 200_001, need_major_by: :oldgen)),
           "a major resets the bound"
  end

  # Recorded on Ruby 3.4, "large" shape (docs/BENCHMARKS.md, "OobGC: GC runs per request"): pool 1
  # swept to 18% free after every GC while the shared allocatable slots made
  # every pool look roomy. Ruby asks for a :nofree major at the third minor;
  # growth must be wanted for pool 1 even though #shortfall, counting the
  # shared slots, says nothing is short.
  def test_no_full_mark_wants_growth_for_a_pool_under_rubys_free_minimum
    policy = Policy::NoFullMark.new
    req = profile([55_000, 3_500, 6_000])
    after_gc = pooled([[943_143, 491_082], [99_024, 80_853], [266_113, 199_830]], shared_allocatable: 35_727)
    assert_equal [0, 0, 0], policy.shortfall(after_gc, req, cover: 2.1)
    short = policy.growth_shortfall(after_gc, req, cover: 2.1)
    free1 = 99_024 - 80_853
    assert_operator short[1], :>=, (99_024 * 0.2).ceil + 3_500 - free1, "Ruby's 20% and one request more"
    # Under that minimum, as far as Ruby's free goal (40%), as Ruby grows it.
    assert_in_delta ((99_024 * 0.4) - free1) / 0.6, short[1], 1
    # Without the shared slots it falls short of its share of the requests pool 0 holds too (8.2).
    assert_operator short[1], :>=, (3_500 * (452_061 / 55_000.0)).ceil - free1
    assert_equal 0, short[0]
    # Pool 2 holds 66,283 free of its own: 25%, and 11 requests.
    assert_equal 0, short[2]
    pool, plan = policy.grow_by_allocation(after_gc, short, req, budget: 64 << 20, cover: 2.1)
    assert_equal 1, pool
    assert_equal [0, short[1], 0], plan, "pool 1 to its free goal"
    assert_nil policy.grow_by_allocation(after_gc, short, req, budget: 0, cover: 2.1), "no budget, no growth"
  end

  # Recorded on Ruby 3.4, "huge" shape: one request allocates 432k objects
  # in pool 0, which after a GC holds 602k free: the next request fits, the
  # one after does not, so a GC runs after every request unless pool 0 grows.
  def test_no_full_mark_grows_the_pool_that_runs_out_first
    policy = Policy::NoFullMark.new(step_bytes: 64 << 20)
    req = profile([432_000, 3_000, 20_000])
    after_gc = pooled([[1_093_766, 491_040], [108_022, 90_000], [298_838, 199_835]])
    short = policy.growth_shortfall(after_gc, req, cover: 2.1)
    assert_in_delta (432_000 * 2.1) - 602_726, short[0], 1
    assert_operator short[1], :>, 0, "pool 1 is under 20% + one request too"
    # Pool 0 holds 1.4 requests, pool 1 six (under Ruby's free minimum):
    # pool 0 is the one to run dry, and takes what it lacks first.
    pool, plan = policy.grow_by_allocation(after_gc, short, req, budget: 12 << 20, cover: 2.1)
    assert_equal 0, pool
    assert_equal short[0], plan[0]
    assert_equal 0, plan[2]
    assert_operator plan[1], :<, short[1], "the budget's rest"
    assert_nil policy.grow_by_allocation(after_gc, short, req, budget: 1, cover: 2.1), "not one slot fits"
    assert_nil policy.grow_by_allocation(after_gc, [0, 0, 0], req, budget: 64 << 20, cover: 2.1), "nothing short"
  end

  # Recorded on Ruby 3.4, "large" shape, after the 101st request: pool 0
  # lacks the most bytes for 10 requests; grown for all it lacked, it took
  # the whole growth budget, and pool 2, at 6 requests, then decided how
  # often GC ran.
  def test_no_full_mark_raises_the_pools_that_run_out_first_together
    policy = Policy::NoFullMark.new(step_bytes: 64 << 20)
    req = profile([82_008, 3_012, 11_043])
    after_gc = pooled([[818_697, 490_501], [124_398, 80_745], [266_124, 199_754]])
    short = policy.growth_shortfall(after_gc, req, cover: 2.1, want: 10)
    assert_operator short[0] * 40, :>, short[2] * 160, "pool 0 lacks the most bytes"
    pool, plan = policy.grow_by_allocation(after_gc, short, req, budget: 12 << 20, cover: 2.1)
    assert_equal 0, pool, "pool 0 runs out first"
    assert_operator plan.each_with_index.sum { |n, i| n * (40 << i) }, :<=, 12 << 20
    held = [328_196 + plan[0], 43_653 + plan[1], 66_370 + plan[2]].zip(req.objects).map { |f, n| f.fdiv(n) }
    assert_in_delta held[0], held[2], 0.01, "pools 0 and 2 raised to one level"
    assert_operator held[0], :>, 6, "past where pool 2 was"
    assert_equal 0, plan[1], "pool 1 holds 14"
    # The step Ruby allows bounds the plan's slots as the budget bounds its bytes, and so does step_bytes.
    _, plan = Policy::NoFullMark.new(step_bytes: 1 << 30).grow_by_allocation(after_gc, short, req, budget: 1 << 30,
                                                                            cover: 2.1)
    assert_operator plan.sum, :<=, policy.growth_step(after_gc, 0)
    _, plan = Policy::NoFullMark.new(step_bytes: 4 << 20).grow_by_allocation(after_gc, short, req, budget: 1 << 30,
                                                                            cover: 2.1)
    assert_operator plan.each_with_index.sum { |n, i| n * (40 << i) }, :<=, 4 << 20
  end

  # The Rails bench app on 3.4 (Ruby's initial slots in every pool), with
  # `objects` per request per pool.
  def rails34(objects) = [Policy::NoFullMark.new(init_slots: [10_000] * 5), profile(objects)]

  # Half the growth budget of a Rails worker on 3.4 (a fifth of its 90 MB).
  SPARE = 9 << 20

  # Recorded on Ruby 3.4, the Rails bench app behind Unicorn, a worker's
  # 30th GC: pools 1 and 2 a few slots short of `want` requests. Each growth
  # costs a GC of its own; grown by what they lacked, the pools grew again
  # and again as their live objects crept up.
  def test_no_full_mark_grows_a_pool_by_a_tenth_at_least_or_not_at_all
    policy, req = rails34([5_450, 1_446, 2_733, 213, 48])
    after_gc = pooled([[243_969, 156_027], [57_299, 28_929], [59_276, 15_217], [4_278, 794], [4_783, 235]])
    short = policy.shortfall(after_gc, req, cover: 2.1, want: 10)
    assert_operator short[1], :<, 5_730
    assert_operator short[2], :<, 5_928
    grown = policy.growth_shortfall(after_gc, req, cover: 2.1, want: 10, spare: SPARE)
    # What it lacks, and a step of live objects beyond (see the test below).
    assert_equal 5_730 + short[1], grown[1], "a tenth of pool 1's 57,299 slots beyond"
    assert_equal 0, grown[2], "pool 2, 74% free, would pass Ruby's free share"
    # The main pool, 11,000 slots from short, grows with it (see the test
    # below).
    assert_equal [0, [24_397, 5_857, 0, 0, 0]],
                 policy.grow_by_allocation(after_gc, grown, req, budget: 64 << 20, cover: 2.1)
    # Short by more than a tenth: by what it lacks, and a tenth.
    cramped = pooled([[243_969, 156_027], [57_299, 40_000], [59_276, 15_217], [4_278, 794], [4_783, 235]])
    assert_operator policy.shortfall(cramped, req, cover: 2.1, want: 10)[1], :>, 5_730
    assert_equal policy.shortfall(cramped, req, cover: 2.1, want: 10)[1] + 5_730,
                 policy.growth_shortfall(cramped, req, cover: 2.1, want: 10, spare: SPARE)[1]
  end

  # Each growth costs a GC of its own. A Rails worker on 3.4 (probe of
  # DryGrowth, docs/BENCHMARKS.md) grew its pools three times in its first
  # 150 requests, one pool at a time as each came short, the main pool at
  # its 41st request and again at its 122nd as its live objects crept up: a
  # pool that a step more live objects would leave short grows with the
  # pool that is short, and only then.
  def test_no_full_mark_a_growth_takes_along_the_pools_nearly_short
    policy, req = rails34([5_450, 1_446, 2_733, 213, 48])
    # The main pool: 87,942 free, 76,945 wanted (11 reserves of 6,995), a
    # step 24,397.
    grown = lambda do |main_slots, live1, spare: SPARE|
      heap = pooled([[main_slots, 156_027], [57_299, live1], [59_276, 15_217], [4_278, 794], [4_783, 235]])
      policy.growth_shortfall(heap, req, cover: 2.1, want: 10, spare: spare)
    end
    assert_equal [24_397, 5_857, 0, 0, 0], grown.(243_969, 28_929)
    # Nothing short: nothing grows, the main pool as near as before.
    assert_equal [0] * 5, grown.(243_969, 20_000)
    # A main pool more than a step from short stays as it is.
    assert_equal [0, 5_857, 0, 0, 0], grown.(300_000, 28_929)
    # No step ahead past half the budget: what is short, as it is short.
    assert_equal [0, 5_730, 0, 0, 0], grown.(243_969, 28_929, spare: 1 << 20)
  end

  # Recorded on Ruby 3.4, the Rails bench app behind Unicorn, a worker's
  # 23rd GC (its 104th request): three pools 46,061 slots short, to grow by
  # 65,870 with a step beyond in the two with room for it. Ruby
  # counts the slots it allows, shared by all pools; run dry, the 160-byte
  # pool, which holds the fewest requests, let it allow 25,375, and the main
  # pool took none.
  def test_no_full_mark_runs_dry_a_pool_whose_step_holds_the_plan
    policy, req = rails34([5_453, 1_447, 2_734, 212, 48])
    after_gc = pooled([[219_403, 156_564], [46_655, 29_366], [45_793, 15_611], [3_868, 472], [4_786, 451]])
    short = policy.growth_shortfall(after_gc, req, cover: 2.1, want: 10, spare: SPARE)
    assert_equal [21_941 + 14_143, 4_666 + 11_220, 13_900, 0, 0], short
    assert_operator policy.growth_step(after_gc, 2), :<, short.sum
    pool, plan = policy.grow_by_allocation(after_gc, short, req, budget: 64 << 20, cover: 2.1)
    assert_equal short, plan
    assert_equal 0, pool, "the main pool's step holds the plan"
    # A plan pool 2's step holds: pool 2, which holds the fewest requests.
    pool, plan = policy.grow_by_allocation(after_gc, [0, 11_220, 13_900, 0, 0], req, budget: 64 << 20, cover: 2.1)
    assert_equal [2, [0, 11_220, 13_900, 0, 0]], [pool, plan]
  end

  # Recorded on Ruby 3.4, "tiny" shape behind Puma, right after a GC: the
  # main pool holds 191 requests, the 160-byte pool 358 and the 80-byte pool
  # 1,100; the collector ran a GC every 190 requests where Ruby alone, its
  # pools grown where they ran dry, ran one every 360.
  def test_no_full_mark_raises_the_pool_that_runs_out_first_to_the_next_pools_level
    policy = Policy::NoFullMark.new(init_slots: [10_000] * 5)
    req = profile([1_557, 62, 209, 3, 0])
    after_gc = pooled([[823_000, 525_000], [155_000, 86_000], [277_000, 202_000], [6_000, 3_000], [1_000, 0]])
    held = ->(short) { [298_000 + short[0], 75_000 + short[2]].zip([1_557, 209]).map { |f, n| f.fdiv(n) } }
    assert_equal 0, policy.growth_shortfall(after_gc, req, cover: 2.1)[0], "a young worker grows for `cover` only"
    short = policy.growth_shortfall(after_gc, req, cover: 2.1, want: 10, spare: 64 << 20)
    assert_in_delta held.(short)[1] - 1, held.(short)[0], 0.01, "all but one request of pool 2's level"
    assert_equal [0, 0], [short[1], short[2]]
    # Pool 3's few objects a request do not set the level (its 3,000 free
    # slots hold 1,000 requests).
    one_pool = pooled([[823_000, 525_000], [155_000, 155_000], [277_000, 277_000], [6_000, 3_000], [1_000, 0]])
    bare = Policy::NoFullMark.new(init_slots: [10_000] * 5)
    flat = profile([1_557, 0, 0, 3, 0])
    assert_equal 0, bare.growth_shortfall(one_pool, flat, cover: 2.1, want: 10, spare: 64 << 20)[0]
    # No further than Ruby's free share: 60% of the pool free after a GC.
    roomy = pooled([[823_000, 525_000], [155_000, 86_000], [900_000, 100_000], [6_000, 3_000], [1_000, 0]])
    capped = policy.growth_shortfall(roomy, req, cover: 2.1, want: 10, spare: 64 << 20)[0]
    assert_in_delta (525_000 * 0.6 / 0.4) - 298_000, capped, 1
    # Within the spare bytes it is given, and none without.
    assert_equal (4 << 20) / 40, policy.growth_shortfall(after_gc, req, cover: 2.1, want: 10, spare: 4 << 20)[0]
    assert_equal 0, policy.growth_shortfall(after_gc, req, cover: 2.1, want: 10)[0]
    # Where the malloc limit brings a GC every 32 requests, no pool needs more.
    mallocs = profile([1_557, 62, 209, 3, 0], malloc: 1 << 20)
    assert_equal 0, Policy::NoFullMark.new(init_slots: [10_000] * 5, malloc_limit_max: 32 << 20)
                                      .growth_shortfall(after_gc, mallocs, cover: 2.1, want: 10, spare: 64 << 20)[0]
    pool, plan = policy.grow_by_allocation(after_gc, short, req, budget: 64 << 20, cover: 2.1)
    assert_equal 0, pool
    assert_operator plan[0], :>, 0
  end

  # Recorded on Ruby 3.4, the Rails bench app under Unicorn: the 640-byte
  # pool held 1,624 slots, 249 of them live, below its 10,000 initial slots.
  # Ruby wants 20% of the larger of the two free, 2,000 slots, and asked for
  # a :nofree major every fourth GC; measured against its own size the pool
  # looked roomy (85% free).
  def test_no_full_mark_keeps_rubys_free_minimum_of_a_pool_below_its_initial_slots
    req = profile([5_449, 1_445, 2_726, 213, 48])
    after_gc = pooled([[309_478, 154_774], [70_378, 28_592], [88_716, 14_921], [6_926, 469], [1_624, 249]])
    policy = Policy::NoFullMark.new(init_slots: [10_000] * 5)
    short = policy.growth_shortfall(after_gc, req, cover: 2.1)
    assert_operator short[4], :>=, 2_000 + 48 - (1_624 - 249)
    assert_equal 4_000 - (1_624 - 249), short[4], "to Ruby's free goal of its initial slots, 40% of 10,000"
    assert_equal 0, short[3], "6,457 free: above 2,000"
    # Grown past its initial slots, the pool keeps the goal of its new size.
    full = pooled([[309_478, 154_774], [70_378, 28_592], [88_716, 14_921], [6_926, 469], [9_000, 8_500]])
    grown = policy.growth_shortfall(full, req, cover: 2.1)[4]
    assert_in_delta 0.4, (500 + grown).fdiv(9_000 + grown), 0.001
    assert_operator 9_000 + grown, :>, 10_000
    assert policy.grows_freely?(after_gc, 4, short[4]), "below its initial slots: pages with no GC"
    refute policy.grows_freely?(after_gc, 4, 9_000)
    refute policy.grows_freely?(after_gc, 0, 1)

    # Booted with RUBY_GC_HEAP_4_INIT_SLOTS below its size, the pool's own size counts.
    small = Policy::NoFullMark.new(init_slots: Policy::NoFullMark.init_slots({ "RUBY_GC_HEAP_4_INIT_SLOTS" => "1000" }))
    assert_equal 0, small.growth_shortfall(after_gc, req, cover: 2.1)[4]
    assert_equal [10_000, 10_000, 10_000, 10_000, 1_000],
                 Policy::NoFullMark.init_slots({ "RUBY_GC_HEAP_4_INIT_SLOTS" => "1000",
                                                 "RUBY_GC_HEAP_0_INIT_SLOTS" => "junk" }, pools: 5)
  end

  # A pool under its initial slots takes pages as a request needs them,
  # with no GC (measured on 3.4: the 640-byte pool grew from 304 slots to
  # 3,358 with no GC): its few free slots make no GC due. Past its initial
  # slots they do. Growth still keeps Ruby's 20% of it free (the test above).
  def test_no_full_mark_a_pool_under_its_initial_slots_is_not_short
    req = profile([5_449, 1_445, 2_726, 213, 48])
    heaps = [[309_478, 154_774], [70_378, 28_592], [88_716, 14_921], [6_926, 6_900], [1_624, 1_600]]
    policy = Policy::NoFullMark.new(init_slots: [10_000] * 5)
    assert_nil policy.decide(pooled(heaps), req)
    assert_equal 26 + (10_000 - 6_926), policy.free(pooled(heaps))[3]
    assert_equal (((6_926 * 0.4) - 26) / 0.6).ceil, policy.growth_shortfall(pooled(heaps), req, cover: 2.1)[3],
                 "the pool's own free slots, short of Ruby's minimum: to its free goal, past its initial slots"
    at_init = Policy::NoFullMark.new(init_slots: [10_000, 10_000, 10_000, 6_926, 1_624])
    assert_equal :minor, at_init.decide(pooled(heaps), req)
  end

  # Running a pool dry right after a GC, Ruby grows it by 1 / (1 - 0.4)
  # (its free goal; the growth factor 1.8 caps it): two thirds of its slots.
  def test_no_full_mark_growth_step_is_two_thirds_of_the_pool
    policy = Policy::NoFullMark.new
    reading = pooled([[900_000, 450_000], [100_000, 80_000]])
    assert_in_delta 900_000 * 2 / 3.0, policy.growth_step(reading, 0), 2
    assert_in_delta 100_000 * 2 / 3.0, policy.growth_step(reading, 1), 2
  end

  def test_no_full_mark_growth_the_collector_made_resets_the_valve
    policy = Policy::NoFullMark.new(valve_ratio: 2.0)
    policy.collected(:major, pooled([[100_000, 50_000]], available: 100_000))
    policy.collected(:grown, pooled([[180_000, 50_000]], available: 180_000))
    refute policy.valve?(pooled([[300_000, 250_000]], available: 300_000, need_major_by: :nofree))
    assert policy.valve?(pooled([[360_001, 250_000]], available: 360_001, need_major_by: :nofree))
  end

  # The issue's case: a fresh worker whose heap is smaller than what one
  # request allocates (158k slots, ~120k per request). Just after a GC the
  # heap cannot hold the next request: collecting early gains nothing, and
  # the policy says how much the heap must grow to hold the next ones.
  def test_high_allocation_fresh_worker_is_starved_and_told_how_much_to_grow
    policy = Policy::OneHeap.new(page_slots: PAGE, headroom: 1.1)
    req = profile(120_000)
    after_gc = one_heap(eden: 158_000, free: 98_000, marked: 60_000)
    assert policy.starved?(after_gc, req)
    assert_equal :minor, policy.decide(after_gc, req)
    short = policy.shortfall(after_gc, req, cover: 2.1)
    assert_equal 1, short.size
    assert_in_delta (120_000 * 2.1) - policy.free(after_gc)[0], short[0], 1
    # Once the heap has grown by that much, the next request fits and
    # nothing is due until it has run.
    grown = one_heap(eden: 158_000 + short[0] + PAGE, free: 98_000 + short[0] + PAGE, marked: 60_000)
    refute policy.starved?(grown, req)
    assert_nil policy.decide(grown, req)
    assert_equal [0], policy.shortfall(grown, req, cover: 2.1)
  end

  # A heap just collected is cramped (the budget may give way) from the
  # request's objects at the headroom and a slack down, not once it falls
  # short of `cover` (a GC after every request, all out of band).
  def test_cramped_below_the_reserve_of_one_request
    policy = Policy::OneHeap.new(page_slots: PAGE, headroom: 1.1)
    req = profile(100_000)
    reserve = ((100_000 * 1.1) + Policy::SLACK).ceil
    assert policy.cramped?(one_heap(eden: 300_000, free: reserve - 1, marked: 300_000 - reserve + 1), req)
    refute policy.cramped?(one_heap(eden: 300_000, free: reserve, marked: 300_000 - reserve), req)
    refute policy.cramped?(one_heap(eden: 400_000, free: 200_000, marked: 200_000), req)
    assert policy.shortfall(one_heap(eden: 400_000, free: 200_000, marked: 200_000), req, cover: 2.1).first.positive?
    refute policy.cramped?(one_heap(eden: 300_000, free: 1_000, marked: 299_000), Profile.new), "nothing learned yet"
  end

  # The slack past the request at the headroom is what the largest request
  # learned went beyond the figure: at least LEAST_SLACK, at most SLACK, and
  # no more than the request itself.
  def test_the_reserve_keeps_what_the_largest_request_went_beyond
    policy = Policy::OneHeap.new(page_slots: PAGE, headroom: 1.1)
    reading = ->(free) { one_heap(eden: 300_000, free: free, marked: 300_000 - free) }
    { 0 => Policy::LEAST_SLACK, 400 => 400, 9_000 => Policy::SLACK }.each do |beyond, slack|
      req = profile(10_000, beyond: beyond)
      assert_equal beyond, req.beyond.first
      reserve = (11_000 + slack).ceil
      assert_equal :minor, policy.decide(reading.(reserve - 1), req), "#{beyond} beyond"
      assert_nil policy.decide(reading.(reserve), req), "#{beyond} beyond"
    end
    assert_in_delta 55 + 50, policy.reserve(50, 1.1, 9_000), 1e-9, "no more than the request"
    assert_in_delta 11_000 + Policy::SLACK, policy.reserve(10_000, 1.1), 1e-9, "nothing learned beyond: SLACK"
  end

  # The collector skips readings while allocation stays within the margins:
  # they must be exactly where #decide starts answering.
  def test_margins_end_where_decide_starts_answering
    policy = Policy::OneHeap.new(page_slots: PAGE, headroom: 1.1, malloc_limit_max: 32 << 20)
    req = profile(50_000, malloc: 1 << 20)
    margins = policy.margins(one_heap(free: 200_000, malloc: 4 << 20, malloc_limit: 24 << 20), req)
    assert_in_delta 200_000 - 55_000 - 1_000, margins.objects[0], 1
    assert_in_delta (24 << 20) - (4 << 20) - (1.1 * (1 << 20)), margins.malloc, 1
    left = margins.objects[0]
    assert_nil policy.decide(one_heap(free: 200_000 - left, malloc: (4 << 20) + margins.malloc, malloc_limit: 24 << 20),
                             req)
    assert_equal :minor, policy.decide(one_heap(free: 200_000 - left - 1, malloc: 4 << 20, malloc_limit: 24 << 20), req)
    assert_equal :minor, policy.decide(one_heap(free: 200_000, malloc: (4 << 20) + margins.malloc + 1,
                                                malloc_limit: 24 << 20), req)
    low = policy.margins(one_heap(free: 200_000, malloc_limit: 16 << 20), req)
    assert_in_delta (16 << 20) - (1.1 * (1 << 20)), low.malloc, 1, "a malloc limit at its minimum bounds too"
    assert_nil policy.margins(one_heap(free: 50_000), req), "something is due now"

    pools = Policy::SizePools.new(headroom: 1.0)
    req = profile([10_000, 0, 1_000])
    margins = pools.margins(pooled([[100_000, 50_000], [50_000, 40_000], [20_000, 10_000]]), req)
    assert_equal [50_000 - 10_000 - 1_000, nil, 10_000 - 1_000 - 1_000], margins.objects
  end

  # A relearn moves the margins as a new reading would have, without one.
  def test_remargin_is_the_margins_the_new_profile_gives_at_the_same_reading
    learned = ->(req) { req.learned }
    was = profile(50_000, malloc: 1 << 20)
    [profile(48_000, malloc: 1 << 20), profile(52_000, malloc: 1 << 20),
     profile(50_000, malloc: 1 << 20, beyond: 300)].each do |now|
      policy = Policy::OneHeap.new(page_slots: PAGE, malloc_limit_max: 32 << 20)
      reading = one_heap(free: 200_000, malloc: 4 << 20, malloc_limit: 24 << 20)
      moved = policy.remargin(policy.margins(reading, was), learned[was], learned[now])
      assert_equal policy.margins(reading, now).objects, moved.objects
      assert_equal policy.margins(reading, now).malloc, moved.malloc
    end

    reading = pooled([[100_000, 50_000], [50_000, 40_000], [20_000, 10_000]], shared_allocatable: 4_000)
    [Policy::SizePools.new, Policy::NoFullMark.new].each do |policy|
      was = profile([10_000, 0, 1_000])
      now = profile([12_000, 0, 900])
      moved = policy.remargin(policy.margins(reading, was), learned[was], learned[now])
      assert_equal policy.margins(reading, now).objects, moved.objects, policy.name
      assert_equal [40, 80, 160], moved.slot_sizes
      # A pool that needed no room had no margin: it needs a reading.
      assert_nil policy.remargin(policy.margins(reading, was), learned[was], learned[profile([10_000, 50, 1_000])])
    end
  end

  # The malloc margin of a quiet stretch never rises with a relearn:
  # NoFullMark's is also bounded by oldmalloc, which the profile does not move.
  def test_remargin_never_raises_the_malloc_margin
    policy = Policy::NoFullMark.new
    reading = pooled([[100_000, 50_000]], malloc_increase_bytes_limit: 30 << 20,
                                          oldmalloc_increase_bytes: 15 << 20, oldmalloc_increase_bytes_limit: 16 << 20)
    was = profile([1_000], malloc: 2 << 20)
    margins = policy.margins(reading, was)
    assert_equal 1 << 20, margins.malloc, "oldmalloc's room"
    at = ->(malloc) { [was.objects, malloc, was.beyond] }
    assert_equal 1 << 20, policy.remargin(margins, at[2 << 20], at[1 << 20]).malloc
    assert_operator policy.remargin(margins, at[2 << 20], at[3 << 20]).malloc, :<, 1 << 20
  end

  # Ruby 3.4: the pools share one count of allocatable slots, which #free
  # counts in each; pages the main pool takes from it are room a small
  # pool loses, though that pool allocated nothing.
  def test_margins_charge_each_pool_for_the_shared_pages_others_take
    policy = Policy::SizePools.new(headroom: 1.0)
    req = profile([10_000, 0, 100])
    reading = pooled([[100_000, 95_000], [50_000, 40_000], [20_000, 19_900]], shared_allocatable: 40_000)
    margins = policy.margins(reading, req)
    refute_nil margins.slot_sizes
    assert_nil margins.least
    base = [0, 0, 0]
    # Pool 2 (160-byte slots) sees 40,000 / 4 + 100 free and needs 200.
    assert margins.holds?([0, 0, 0], base, 0)
    assert margins.holds?([10_000, 0, 0], base, 0)
    refute margins.holds?([38_000, 0, 0], base, 0), "pool 0 took what pool 2 counted on"
    # Without shared slots the pools are apart.
    apart = policy.margins(pooled([[100_000, 50_000], [50_000, 40_000], [20_000, 10_000]]), req)
    assert_nil apart.slot_sizes
    assert apart.holds?([38_000, 0, 0], base, 0)
  end

  # The advice at boot is the heap the worker has: the pages it uses, each
  # pool's slots rounded up to whole pages, not the allocatable pages Ruby
  # would add later; more where the next `cover` requests would not fit.
  def test_boot_env_advises_the_pages_in_use_in_whole_pages
    heaps = [
      { slot_size: 40, heap_eden_pages: 160, heap_eden_slots: 261_920, heap_allocatable_pages: 1 },
      { slot_size: 80, heap_eden_pages: 68, heap_eden_slots: 55_692, heap_allocatable_pages: 35 },
      { slot_size: 160, heap_eden_pages: 10, heap_eden_slots: 4_090, heap_allocatable_pages: 0 },
      { slot_size: 320, heap_eden_pages: 5, heap_eden_slots: 1_020, heap_allocatable_pages: 20 }
    ]
    lives = [160_000, 40_000, 3_000, 500]
    heaps = heaps.zip(lives).map do |h, live|
      h.merge(total_allocated_objects: 1_000_000 + live, total_freed_objects: 1_000_000)
    end
    reading = { stat: { malloc_increase_bytes_limit: 16 << 20 }, heaps: heaps, info: { state: :none } }
    env = Policy::SizePools.new.boot_env(reading, profile([6_000, 1_400, 1_000, 0]), cover: 2.1)

    assert_equal({ "RUBY_GC_HEAP_0_INIT_SLOTS" => 160 * 1_637,
                   "RUBY_GC_HEAP_1_INIT_SLOTS" => 68 * 819,
                   # 3,000 live + 2.1 x 1,000: 5,100 slots, on 13 pages of 409
                   "RUBY_GC_HEAP_2_INIT_SLOTS" => 13 * 409 }, env)
  end

  def test_boot_env_on_one_heap_and_for_malloc
    policy = Policy::OneHeap.new(page_slots: PAGE)
    reading = one_heap(free: 100_000, eden: 300_000, allocatable: 50_000)
    env = policy.boot_env(reading, profile(20_000, malloc: 10 << 20), cover: 2.1)
    assert_equal 734 * PAGE, env.fetch("RUBY_GC_HEAP_INIT_SLOTS"), "300,000 slots in use, not the allocatable"
    assert_equal 22_021_000, env.fetch("RUBY_GC_MALLOC_LIMIT"), "2.1 requests of 10 MB, above the 16 MB limit"
    refute env.key?("RUBY_GC_MALLOC_LIMIT_MAX"), "under Ruby's 32 MB maximum"

    env = policy.boot_env(one_heap(free: 10_000, eden: 300_000), profile(20_000, malloc: 20 << 20), cover: 2.1)
    assert_equal 812 * PAGE, env.fetch("RUBY_GC_HEAP_INIT_SLOTS"), "290,000 live + 2.1 requests of 20,000"
    assert_equal env.fetch("RUBY_GC_MALLOC_LIMIT"), env.fetch("RUBY_GC_MALLOC_LIMIT_MAX")
    assert_empty policy.boot_env(reading, Profile.new, cover: 2.1)
  end

  def test_detect_picks_one_policy_per_gc_model
    one = Module.new { def self.respond_to?(name, *) = name == :stat }
    assert_equal Policy::OneHeap, Policy.detect(one)
    pools = Module.new do
      def self.respond_to?(name, *) = %i[stat stat_heap].include?(name)
      def self.stat_heap(_) = { total_allocated_objects: 1 }
    end
    assert_equal Policy::SizePools, Policy.detect(pools)
    configurable = Module.new do
      def self.respond_to?(name, *) = %i[stat stat_heap config].include?(name)
      def self.stat_heap(_) = { total_allocated_objects: 1 }
      def self.config = { rgengc_allow_full_mark: true }
    end
    assert_equal Policy::NoFullMark, Policy.detect(configurable)
  end

  # A simulated worker, request by request, against Ruby alone on the same
  # heap: OobGC must keep GC out of requests without collecting more than
  # 1.1x as often. Requests vary (a few large ones among many).
  def test_collects_no_more_than_ruby_alone_would_at_the_same_heap_size
    rng = Random.new(42)
    sizes = Array.new(2_000) { (rng.rand < 0.05 ? 90_000 : 40_000) + rng.rand(10_000) }
    capacity = 800_000
    live = 100_000
    ruby = simulate(sizes, capacity, live, nil)
    policy = Policy::OneHeap.new(page_slots: PAGE, headroom: 1.1)
    ours = simulate(sizes, capacity, live, policy)
    assert_operator ruby[:inside], :>=, 100, ruby
    assert_operator ours[:inside], :<=, (ours[:inside] + ours[:outside]) * 0.1, ours
    assert_operator ours[:inside] + ours[:outside], :<=, ruby[:inside] * 1.1, "ours #{ours}, Ruby #{ruby}"
  end

  private

  # Free slots run down by each request; a GC (Ruby's, mid-request, or the
  # policy's, between requests) frees all but the live set.
  def simulate(sizes, capacity, live, policy)
    req = Profile.new
    free = capacity - live
    counts = { inside: 0, outside: 0 }
    sizes.each do |size|
      if size > free
        counts[:inside] += 1
        free = capacity - live - (size - free)
      else
        free -= size
      end
      next unless policy

      req.record([size], 0)
      reading = one_heap(eden: capacity, free: free, old: live, old_limit: live * 2)
      next unless policy.decide(reading, req)

      counts[:outside] += 1
      free = capacity - live
    end
    counts
  end
end
