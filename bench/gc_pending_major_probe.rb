# frozen_string_literal: true
# How many objects a size pool takes before Ruby starts a GC, against the free slots GC.stat_heap shows,
# with and without a major GC pending (need_major_by). Pool 1 objects: 40-character Strings (80-byte slots).
# PENDING=1 (run with RUBY_GC_MALLOC_LIMIT(_MAX) raised) mallocs 18 MB, so the minor GC.start finds oldmalloc
# over its 16 MB limit and asks for a major; the minor is swept at once.
A = "a"
def free(i) = (h = GC.stat_heap(i); h[:heap_eden_slots] - (h[:total_allocated_objects] - h[:total_freed_objects]))
keep = Array.new(30_000) { A * 40 }
GC.start
junk = Array.new(20_000) { A * 40 }; junk = nil
big = ENV["PENDING"] ? A * (18 << 20) : nil
hold = Array.new(100_000); d = Array.new(5, 0); f0 = Array.new(5, 0)
GC.start(full_mark: false, immediate_sweep: true)
c = GC.count
need = GC.latest_gc_info(:need_major_by)
i = 0
(f0[i] = free(i); d[i] = -GC.stat_heap(i, :total_allocated_objects); i += 1) while i < 5
n = 0
(hold[n] = A * 40; n += 1) while GC.count == c
i = 0
(d[i] += GC.stat_heap(i, :total_allocated_objects); i += 1) while i < 5
puts "#{RUBY_VERSION} need_major_by=#{need.inspect} free per pool=#{f0} " \
     "allocatable: #{GC.stat_heap(1).fetch(:heap_allocatable_pages, 0)} pages in pool 1, #{GC.stat.fetch(:heap_allocatable_slots, 0)} shared slots -> " \
     "GC after #{d[1]} pool-1 allocations (#{GC.latest_gc_info.slice(:gc_by, :major_by)}); other pools #{d.values_at(0, 2, 3, 4)}"
