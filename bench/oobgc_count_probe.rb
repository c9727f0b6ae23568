# frozen_string_literal: true
# For bench/oobgc_rails.rb --patch: from the 101st request on, the
# collector's GC runs (#run), the GCs they ran, and any GC run while sizing
# the heap or deciding; into count.PID.txt in $OOBGC_MAJORS_DIR every 500
# requests.
module CountProbe
  T = Hash.new(0)
  DIR = ENV.fetch("OOBGC_MAJORS_DIR", Dir.pwd)
  def run(kind, reading, headroom: @policy.headroom)
    c = GC.count
    r = super
    if @seen > 100
      T[:run_calls] += 1
      T[:run_gcs] += GC.count - c
      T[:run_gcs_reported] += r
    end
    r
  end

  def size(reading)
    c = GC.count
    super
    T[:size_gcs] += GC.count - c if @seen > 100
  end

  def decide(reading, headroom)
    c = GC.count
    r = super
    T[:decide_gcs] += GC.count - c if @seen > 100
    r
  end

  def finished(token)
    r = super
    T[:requests] += 1 if @seen > 100
    File.write(File.join(DIR, "count.#{Process.pid}.txt"), T.inspect) if (@seen % 500).zero?
    r
  end
end
Memkit::OobGC::Collector.prepend(CountProbe)
