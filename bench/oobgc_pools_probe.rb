# frozen_string_literal: true

# For bench/oobgc_rails.rb --patch (Ruby 3.4): each out-of-band GC a worker
# runs, with the request count, the kind, and per pool the free slots, the
# reserve the collector keeps, the mean requests those free slots hold and
# the pool's slots; each growth by running a pool dry (DryGrowth#run_dry),
# with its plan; each minor GC DryGrowth#spent ran to take back Ruby's
# allowance. Into why-PID.log in $OOBGC_PROBE_DIR (default /memkit/tmp/probe,
# the repository's tmp/probe under script/ruby34). bench/oobgc_decide_probe.rb
# logs the GCs alone, from the 151st request; this one follows the growth from
# the first, which is where a worker's pools come to differ.
module WhyProbe
  LOG = []
  SUM = Hash.new(0)
  def record_since(now, before, malloc)
    if before
      now.each_index { |i| SUM[i] += now[i] - before[i] }
      SUM[:n] += 1
    end
    super
  end
  Memkit::OobGC::Profile.prepend(self)
end

module WhyRun
  def run(kind, reading, headroom: @policy.headroom)
    n = WhyProbe::SUM[:n]
    obj = @profile.objects
    free = @policy.free(reading)
    mean = obj.each_index.map { |i| n.zero? ? 0 : WhyProbe::SUM[i].fdiv(n) }
    rows = free.each_index.map do |i|
      next if obj.fetch(i, 0) < 100
      [i, free[i], @policy.reserve(obj[i], headroom, @profile.beyond[i]).round, (free[i] / mean[i]).round(1), reading[:heaps][i][:heap_eden_slots]]
    end.compact
    WhyProbe::LOG << "#{@seen} #{kind} h=#{headroom} #{rows.inspect}"
    super
  end
  Memkit::OobGC::Collector.prepend(self)
end

module WhySpent
  def spent
    r = super
    WhyProbe::LOG << "#{WhyProbe::SUM[:n]} spent-GC" if r
    r
  end
  Memkit::OobGC::DryGrowth.prepend(self)
end

module WhyDry
  def run_dry(pool, reading)
    r = super
    WhyProbe::LOG << "#{WhyProbe::SUM[:n]} dry pool=#{pool} ran=#{r} plan=#{@plan.inspect}"
    r
  end
  Memkit::OobGC::DryGrowth.prepend(self)
end

at_exit do
  next if WhyProbe::LOG.empty?
  n = WhyProbe::SUM[:n]
  File.open(File.join(ENV.fetch("OOBGC_PROBE_DIR", "/memkit/tmp/probe"), "why-#{Process.pid}.log"), "w") do |f|
    f.puts "mean per pool: #{GC.stat_heap.keys.map { |i| n.zero? ? 0 : (WhyProbe::SUM[i] / n) }.inspect} over #{n}; count #{GC.count}"
    WhyProbe::LOG.each { |l| f.puts l }
  end
end
