# frozen_string_literal: true

# For bench/oobgc_cell.rb's FILE: each worker's heap as it serves, one line
# every 10th of its first 50 requests and every 100th after: GC runs and
# majors so far, RSS, slots per size pool (thousands) and, with OobGC, the
# bytes its growth has counted and the growths run. Into
# heap-trajectory.PID.txt in $OOBGC_TRAJECTORY_DIR (default: /tmp).
#
#   bundle exec ruby -Ilib bench/oobgc_cell.rb --pin memkit promoting puma 0 bench/oobgc_heap_trajectory.rb
require_relative "oobgc_app"

module OobgcHeapTrajectory
  DIR = ENV.fetch("OOBGC_TRAJECTORY_DIR", "/tmp")
  POOLS = GC.respond_to?(:stat_heap) ? GC.stat_heap.keys : nil
  @served = 0

  def self.served
    @served += 1
    return unless (@served % 100).zero? || (@served < 50 && (@served % 10).zero?)

    rss_mb = File.read("/proc/self/status")[/VmRSS:\s+(\d+)/, 1].to_i >> 10
    slots = POOLS ? POOLS.map { |i| GC.stat_heap(i, :heap_eden_slots) / 1000 } : [GC.stat(:heap_eden_pages)]
    oob = Memkit::OobGC.stats if defined?(Memkit::OobGC)
    line = format("req=%d gc=%d majors=%d rss=%dMB slots_k=%s", @served, GC.count, GC.stat(:major_gc_count), rss_mb,
                  slots.inspect)
    line += format(" grown=%dMB growths=%d", oob.heap_grown_bytes >> 20, oob.grow_runs) if oob
    File.write(File.join(DIR, "heap-trajectory.#{Process.pid}.txt"), "#{line}\n", mode: "a")
  end

  def call(env)
    OobgcHeapTrajectory.served
    super
  end
end
OobgcBench::Probe.prepend(OobgcHeapTrajectory)
