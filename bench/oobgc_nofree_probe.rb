# frozen_string_literal: true

# For bench/oobgc_rails.rb --patch: after each out-of-band GC (from the 60th
# GC on, 40 lines), each size pool's live objects, slots, free share and
# force_major_gc_count (Ruby 3.4: how often that pool asked for a `:nofree`
# major), with Ruby's need_major_by; into nofree.PID.txt in $OOBGC_MAJORS_DIR
# (default: the server's directory). Finishes each lazy sweep first.
module NofreeProbe
  LOG = []
  DIR = ENV.fetch("OOBGC_MAJORS_DIR", Dir.pwd)
  POOLS = GC::INTERNAL_CONSTANTS.fetch(:HEAP_COUNT, 5)

  def collect(kind, reading, *)
    super
    return if GC.count < 60 || LOG.size >= 40

    GC.enable unless GC.disable
    pools = Array.new(POOLS) do |i|
      h = GC.stat_heap(i)
      live = h[:total_allocated_objects] - h[:total_freed_objects]
      format("%d:%d/%d(%.0f%%,f%d)", i, live, h[:heap_eden_slots],
             100.0 * (h[:heap_eden_slots] - live) / h[:heap_eden_slots], h[:force_major_gc_count])
    end
    LOG << "gc=#{GC.count} #{kind} need=#{GC.latest_gc_info(:need_major_by).inspect} " \
           "alloc=#{GC.stat(:heap_allocatable_slots)} #{pools.join(' ')}"
    File.write(File.join(DIR, "nofree.#{Process.pid}.txt"), "#{LOG.join("\n")}\n")
  end
end
Memkit::OobGC::Collector.prepend(NofreeProbe)
