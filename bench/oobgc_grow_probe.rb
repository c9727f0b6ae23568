# frozen_string_literal: true

# Does holding filler objects across a GC grow Ruby's heap at run time, and
# do the following GCs (minor, then major) give the pages back?
#   ruby bench/oobgc_grow_probe.rb
def pools = GC.respond_to?(:stat_heap) && GC.stat_heap(0).key?(:total_allocated_objects)

def capacity
  s = GC.stat
  s[:heap_available_slots] + s.fetch(:heap_allocatable_pages, 0) * GC::INTERNAL_CONSTANTS[:HEAP_PAGE_OBJ_LIMIT] +
    (s.key?(:heap_allocatable_slots) ? s[:heap_allocatable_slots] : 0)
end

def show(label)
  s = GC.stat
  extra = pools ? " pool0 eden=#{GC.stat_heap(0, :heap_eden_slots)} alloc_pages=#{GC.stat_heap(0)[:heap_allocatable_pages].inspect}" : ""
  puts format("%-28s avail=%8d free=%8d live=%8d allocatable_pages=%6s allocatable_slots=%s cap=%d need_major=%p%s",
              label, s[:heap_available_slots], s[:heap_free_slots], s[:heap_live_slots],
              s[:heap_allocatable_pages].inspect, s[:heap_allocatable_slots].inspect, capacity,
              GC.latest_gc_info[:need_major_by], extra)
end

puts RUBY_DESCRIPTION
KEEP = Array.new(100_000) { |i| "k#{i}" }
GC.start
show("boot")
fillers = []
4.times do |round|
  s = GC.stat
  n = s[:heap_free_slots] + s.fetch(:heap_allocatable_pages, 0) * 409
  n = (n * 0.98).to_i
  fillers << Array.new(n) { Object.new }
  show("filled #{round}")
  GC.start(full_mark: true, immediate_sweep: true)
  show("major after fill #{round}")
  break if capacity > 1_500_000
end
fillers = nil
GC.start(full_mark: false, immediate_sweep: true)
show("minor after drop")
GC.start(full_mark: true, immediate_sweep: true)
show("major after drop")
GC.start(full_mark: true, immediate_sweep: true)
show("2nd major after drop")
t = 0
200.times { t += Array.new(20_000) { Object.new }.size }
show("after 4M allocations")
if GC.respond_to?(:config)
  GC.config(rgengc_allow_full_mark: false)
  m = GC.stat(:major_gc_count)
  GC.start(full_mark: true)
  puts "GC.config full_mark false: GC.start(full_mark: true) ran a major? #{GC.stat(:major_gc_count) > m} #{GC.latest_gc_info.slice(:major_by, :need_major_by)}"
end
