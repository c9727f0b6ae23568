# frozen_string_literal: true

# Memkit::OobGC against no OobGC with the modes' servers up side by side and
# driven in alternating short slices, so that the machine's own drift falls
# on every mode alike:
#
#   flock /tmp/memkit-bench.lock bundle exec ruby -Ilib bench/oobgc_ab.rb \
#     [--shapes tiny,promoting] [--servers unicorn,puma,puma_close] [--slices 10] [--slice 2] [--pin]
#
# Why: on this bench's VM a cell's CPU time per request moves by up to half
# between two runs a minute apart with nothing changed (3.1, "tiny" behind
# Puma one request per connection, no OobGC: 0.52-0.76 ms a request, 1,293
# to 1,931 req/s, over three runs with the same GC runs per request), which is
# more than any throughput line can tell apart. bench/oobgc_p99.rb boots a
# fresh server per mode and round, minutes apart. Here, per (shape, server),
# one server per mode boots and warms (bench/oobgc_matrix.rb's warm-up), and
# then each slice drives every mode in turn, in a rotated order, for
# `--slice` seconds paced at ~60% load and as long saturated. The p99 comes
# from the paced slices' wrk histograms added together, throughput from the
# saturated slices' requests over their seconds. GC runs, majors inside
# requests, CPU time per request and RSS are the workers' own figures after
# the warm-up, as in the matrix; CPU per request against no OobGC says what
# the workers paid for a throughput ratio. The pace is set once, from no OobGC's first saturated slice.
# rps_xm is the median, over the rounds, of a mode's saturated rate over no
# OobGC's in the same round: a slice the VM stalls (a third of its rate
# gone, now and then) moves the pooled rps_x by a few percent, which is the
# size of the throughput line's margin.
#
# none_again (in --modes) boots a second server without OobGC, driven like
# the others: how far two identical servers land apart in the same run (the
# A/A spread), which a memkit cell's ratio has to be read against. Its rows
# are not counted in the lines.
#
# The workers live through all slices, so later slices see older workers, as
# a server in production does; a fresh worker's first GCs fall in the first
# slices.
require_relative "oobgc_matrix"

module OobgcAB
  extend self

  def run(argv)
    opts = { shapes: %w[tiny promoting], servers: OobgcMatrix::SERVERS.keys, slices: 10, slice: 2,
             connections: 4, load: 0.6 }
    OptionParser.new do |o|
      o.on("--shapes LIST", Array) { |v| opts[:shapes] = v }
      o.on("--servers LIST", Array) { |v| opts[:servers] = v }
      o.on("--slices N", Integer) { |v| opts[:slices] = v }
      o.on("--slice S", Integer) { |v| opts[:slice] = v }
      o.on("--modes LIST", Array, "none,memkit[,memkit_plugin][,probe][,none_again]") { |v| opts[:modes] = v }
      o.on("--probe FILE", "mode probe: memkit with FILE required after it") { |v| opts[:probe] = File.expand_path(v) }
      o.on("--pin", "servers on CPU 0, wrk on CPU 1 (OobgcMatrix#pin!)") { opts[:pin] = true }
    end.parse!(argv)
    OobgcMatrix.pin! if opts[:pin]
    abort "wrk not found: script/setup installs it" unless system("command -v wrk >/dev/null")
    puts "oobgc a/b: #{RUBY_DESCRIPTION}; 2 workers per server; wrk -c#{opts[:connections]}; " \
         "#{opts[:slices]} slices of #{opts[:slice]} s per mode and load#{'; pinned' if opts[:pin]}; " \
         "started #{Time.now.utc.strftime('%F %T')} UTC"
    rows = []
    verdicts = Hash.new { |h, k| h[k] = [] }
    opts[:shapes].each do |shape|
      opts[:servers].each do |name|
        kind, close = OobgcMatrix::SERVERS.fetch(name)
        modes = opts[:modes] || (kind == :puma ? %w[none memkit memkit_plugin] : %w[none memkit])
        # No OobGC is what every ratio is against, and it sets the pace.
        modes = ["none", *modes].uniq.reject { |m| m == "memkit_plugin" && kind != :puma }
        modes |= ["probe"] if opts[:probe]
        result = cell(kind, close, shape, modes, opts)
        none = result.fetch("none")
        modes.each do |mode|
          r = result.fetch(mode)
          by_slice = OobgcMatrix.median(r[:slice_rps].zip(none[:slice_rps]).map { |m, n| m / n })
          if mode == "none_again"
            verdicts[:aa] << [r[:p99] / none[:p99], r[:rps] / none[:rps], by_slice]
          elsif mode != "none"
            verdicts[:p99] << (r[:p99] <= none[:p99])
            verdicts[:rps] << (r[:rps] >= 0.95 * none[:rps])
            verdicts[:rps_slices] << (by_slice >= 0.95)
            verdicts[:out] << (r[:out] >= 0.9)
            verdicts[:rss] << (r[:rss] <= 1.3 * none[:rss])
          end
          rows << [name, shape, mode, result[:pace], format("%.1f", r[:p50]), format("%.1f", r[:p99]),
                   format("%.2f", r[:p99] / none[:p99]), format("%.0f", r[:rps]), format("%.2f", r[:rps] / none[:rps]),
                   format("%.2f", by_slice),
                   format("%.3f", r[:gc_per_req]), format("%.2f", r[:gc_per_req] / none[:gc_per_req]),
                   format("%.3f", r[:cpu_per_req]), format("%.2f", r[:cpu_per_req] / none[:cpu_per_req]),
                   format("%.1f", 100 * r[:out]), r[:majors_inside], format("%.2f", r[:rss] / none[:rss])]
        end
      end
    end
    puts Memkit::CLI.table(%w[server shape mode pace_ms p50_ms p99_ms p99_x rps rps_x rps_xm gc/req gc_x
                              cpu_ms/req cpu_x out_% majors_in rss_x],
                           rows, left: [0, 1, 2])
    n = verdicts[:p99].size
    puts "p99 <= no OobGC's (pooled): #{verdicts[:p99].count(true)} of #{n} memkit cells"
    puts "throughput >= 0.95x no OobGC's (pooled): #{verdicts[:rps].count(true)} of #{n}; " \
         "(median of the slices' ratios, rps_xm): #{verdicts[:rps_slices].count(true)} of #{n}"
    puts ">= 90% of GC runs out of requests: #{verdicts[:out].count(true)} of #{n}; " \
         "RSS per worker <= 1.3x no OobGC's: #{verdicts[:rss].count(true)} of #{n}"
    return if verdicts[:aa].empty?

    p99s, rps, rps_m = verdicts[:aa].transpose
    puts "A/A (none_again against none): p99_x #{spread(p99s)}, rps_x #{spread(rps)}, rps_xm #{spread(rps_m)}"
  end

  def spread(ratios) = format("%.2f-%.2f", ratios.min, ratios.max)

  # Boots one server per mode (nested, so all are up at once), then runs the
  # slices. Returns {mode => figures} and :pace.
  def cell(kind, close, shape, modes, opts)
    up = {}
    boot = lambda do |rest|
      return slices(kind, close, shape, up, opts) if rest.empty?

      mode = rest.first
      Dir.mktmpdir("memkit-oobgc-ab") do |dir|
        extra = mode == "memkit_plugin" ? "plugin :memkit" : ""
        source = OobgcMatrix.app_source({ "probe" => "memkit", "none_again" => "none" }.fetch(mode, mode), dir)
        source = source.sub('require "memkit"', "require \"memkit\"\nrequire #{opts[:probe].inspect}") if mode == "probe"
        OobgcMatrix.serve(kind, shape, source, dir, opts, close, extra: extra) do |url|
          up[mode] = { url: url, dir: dir }
          boot.call(rest.drop(1))
        end.tap { up[mode][:probes] = OobgcMatrix.probes(dir) }
      end
    end
    result = boot.call(modes)
    modes.to_h { |mode| [mode, figures(result[:runs][mode], up[mode][:probes])] }.merge(pace: result[:pace])
  end

  # Runs the slices against the servers in `up` (mode => {url:, dir:}).
  # Returns {runs: {mode => [[paced output, histogram], saturated output]...}, pace:}.
  def slices(kind, close, shape, up, opts)
    modes = up.keys
    first = OobgcBenchRunner.parse_wrk(OobgcMatrix.wrk(up["none"][:url], opts[:slice], opts, 0, close, nil))
    cycle_ms = 1000.0 * opts[:connections] / [first[:rps] * opts[:load], 0.1].max
    pace = [(cycle_ms - first[:p50].to_f).round, 1].max
    runs = Hash.new { |h, k| h[k] = [] }
    opts[:slices].times do |i|
      modes.rotate(i).each do |mode|
        Dir.mktmpdir("memkit-oobgc-ab-hist") do |tmp|
          path = File.join(tmp, "latency.txt")
          paced = OobgcMatrix.wrk(up[mode][:url], opts[:slice], opts, pace, close, path)
          saturated = OobgcMatrix.wrk(up[mode][:url], opts[:slice], opts, 0, close, nil)
          runs[mode] << [File.readlines(path).to_h { |line| line.split.map(&:to_i) }, paced, saturated]
        end
      end
      $stderr.puts format("%s %s %s slice %d: %s", Time.now.utc.strftime("%T"), kind, shape, i,
                          modes.map { |m| format("%s %.0f req/s", m, OobgcBenchRunner.parse_wrk(runs[m].last[2])[:rps]) }
                               .join(", "))
    end
    { runs: runs, pace: pace }
  end

  def figures(runs, probes)
    hist = Hash.new(0)
    runs.each { |h, _, _| h.each { |usec, count| hist[usec] += count } }
    saturated = runs.map { |_, _, s| OobgcBenchRunner.parse_wrk(s)[:rps] }
    gcs = probes.sum { |p| p["gc_total"] }
    requests = probes.sum { |p| p["requests"] }
    { p50: OobgcBenchRunner.percentile(hist, 50), p99: OobgcBenchRunner.percentile(hist, 99),
      rps: saturated.sum / saturated.size, # every slice lasts as long: the pooled rate
      slice_rps: saturated,
      gc_per_req: gcs.fdiv([requests, 1].max),
      cpu_per_req: probes.sum { |p| p["cpu_ms"].to_f }.fdiv([requests, 1].max),
      out: gcs.zero? ? 1.0 : 1 - probes.sum { |p| p["gc_inside"] }.fdiv(gcs),
      majors_inside: probes.sum { |p| p["gc_inside_major"] },
      rss: probes.sum { |p| p["rss_kb"] }.fdiv([probes.size, 1].max) }
  end
end

OobgcAB.run(ARGV) if $PROGRAM_NAME == __FILE__
