# frozen_string_literal: true

# For bench/oobgc_rails.rb --patch: at each out-of-band GC from the 151st
# request on (60 lines), the requests since the last one, free slots per
# pool, the learned objects per pool (the percentile) and their mean over the
# window, and how many requests the free slots hold at each. Into
# decide.PID.txt in $OOBGC_MAJORS_DIR (default: the server's directory).
# XWANT=N: see bench/oobgc_want_override.rb.
require_relative "oobgc_want_override"

module DecideProbe
  LOG = []
  DIR = ENV.fetch("OOBGC_MAJORS_DIR", Dir.pwd)
  def run(kind, reading, headroom: @policy.headroom)
    if @seen > 150 && LOG.size < 60
      free = @policy.free(reading)
      cols = @profile.instance_variable_get(:@columns)
      mean = cols.map { |c| (c.sum.fdiv(c.size)).round }
      p95 = @profile.objects
      held = free.each_with_index.map { |f, i| p95[i].to_i.positive? ? format("%.1f/%.1f", f.fdiv(p95[i]), f.fdiv(mean[i])) : "-" }
      st = reading[:stat]
      LOG << format("gc=%d kind=%s seen=%d since=%d state=%s free=%s p95=%s mean=%s held(p95/mean)=%s malloc=%d/%d",
                    GC.count, kind, @seen, @seen - @cycle[1], reading[:info][:state], free.inspect, p95.inspect, mean.inspect,
                    held.join(" "), st[:malloc_increase_bytes], st[:malloc_increase_bytes_limit])
      File.write(File.join(DIR, "decide.#{Process.pid}.txt"), "#{LOG.join("\n")}\n")
    end
    super
  end
end
Memkit::OobGC::Collector.prepend(DecideProbe)
