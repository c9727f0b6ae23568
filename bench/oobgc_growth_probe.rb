# frozen_string_literal: true

# For bench/oobgc_rails.rb --patch (Ruby 3.4): after each out-of-band GC,
# the heap's eden MB, shared allocatable slots before and after sizing, the
# growth budget and what has grown, the pool to run dry and the slots it
# should take, the RSS, slots per pool and the learned profile; and each GC
# a request ran (INSIDE), counted from the first request. Into
# growth.PID.txt in $OOBGC_MAJORS_DIR (default: the server's directory).
# XWANT=N: see bench/oobgc_want_override.rb.
require_relative "oobgc_want_override"

module GrowthProbe
  LOG = []
  DIR = ENV.fetch("OOBGC_MAJORS_DIR", Dir.pwd)
  def finished(token)
    if GC.count != token[0] && LOG.size < 400
      info = GC.latest_gc_info
      pools = Array.new(5) { |i| h = GC.stat_heap(i); "#{i}:#{h[:heap_eden_slots]}/#{h[:total_allocated_objects] - h[:total_freed_objects]}" }.join(" ")
      LOG << format("INSIDE gc=%d seen=%d by=%s major_by=%s alloc=%d eden=%.1fMB %s", GC.count, @seen, info[:gc_by], info[:major_by].inspect,
                    GC.stat(:heap_allocatable_slots), Memkit::OobGC::HeapGrowth.eden_bytes / 1048576.0, pools)
    end
    super
  end

  def size(reading)
    e0 = Memkit::OobGC::HeapGrowth.eden_bytes
    a0 = GC.stat(:heap_allocatable_slots)
    super
    return if LOG.size >= 400
    pools = Array.new(5) { |i| h = GC.stat_heap(i); "#{i}:#{h[:heap_eden_slots]}" }.join(" ")
    LOG << format("gc=%d seen=%d eden=%.1fMB alloc0=%d alloc=%d budget=%.1fMB grown=%.1fMB dry=%s dry_slots=%s rss=%.1fMB %s prof=%s",
                  GC.count, @seen, e0 / 1048576.0, a0, GC.stat(:heap_allocatable_slots), @growth.budget / 1048576.0,
                  @growth.grown_bytes / 1048576.0, @dry&.instance_variable_get(:@pool).inspect, @dry&.instance_variable_get(:@plan).inspect,
                  (Memkit::OobGC::HeapGrowth.rss || 0) / 1048576.0, pools, @profile.objects.inspect)
    File.write(File.join(DIR, "growth.#{Process.pid}.txt"), "#{LOG.join("\n")}\n")
  end
end
Memkit::OobGC::Collector.prepend(GrowthProbe)
