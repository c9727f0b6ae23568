# frozen_string_literal: true

# For bench/oobgc_rails.rb --patch: counts why each out-of-band major ran (Ruby's
# need_major_by before it, major_by after), into majors.PID.txt in $OOBGC_MAJORS_DIR (default: the server's directory),
# rewritten after each major so a worker killed at the end leaves its counts.
module MajorsProbe
  COUNTS = Hash.new(0)
  DIR = ENV.fetch("OOBGC_MAJORS_DIR", Dir.pwd)
  def collect(kind, reading, *)
    need = reading.fetch(:info)[:need_major_by]
    stat = reading.fetch(:stat)
    om = stat[:oldmalloc_increase_bytes].to_i > stat[:oldmalloc_increase_bytes_limit].to_i
    majors = GC.stat(:major_gc_count)
    super
    if GC.stat(:major_gc_count) != majors
      COUNTS["kind=#{kind} need=#{need.inspect} by=#{GC.latest_gc_info(:major_by).inspect} oldmalloc_over=#{om}"] += 1
      File.write(File.join(DIR, "majors.#{Process.pid}.txt"), COUNTS.map { |k, v| "#{v} #{k}" }.join("\n") + "\n")
    end
  end
end
Memkit::OobGC::Collector.prepend(MajorsProbe)
