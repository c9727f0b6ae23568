# frozen_string_literal: true

# p99 latency at ~60% load, and throughput at saturation, Memkit::OobGC
# against no OobGC, from rounds pooled rather than one run per cell; with
# where the GC runs went and each worker's RSS:
#
#   flock /tmp/memkit-bench.lock bundle exec ruby -Ilib bench/oobgc_p99.rb \
#     [--shapes cache,tiny] [--servers puma,unicorn] [--rounds 3] [--duration 8] [--pin]
#
# bench/oobgc_matrix.rb measures each paced cell once, and one 8-second run's
# p99 rests on about 25 of 2,500 requests: the same cell ("cache" behind Puma,
# Ruby 3.3) read 12-27 ms without OobGC in nine runs. Here each (shape, server) boots a fresh server per mode
# and round, the modes in a different order each round, and the percentiles
# come from the rounds' wrk histograms added together. After its paced run,
# the same server is loaded as fast as it answers for as long: throughput is
# the rounds' requests over their seconds. GC runs (out of requests, majors
# inside) are the workers' own counts over both runs, after the warm-up; RSS
# is each worker's at the end, against no OobGC's. The pace is the
# matrix's: from a saturated run without OobGC, each connection pauses so the
# workers are ~60% busy.
#
# wrk corrects its histogram for coordinated omission: a connection held
# up for P ms adds samples at P - i, P - 2i, ..., i being the mean time
# between its requests. So one pause that holds every worker at once (a
# heap growth, a major in both workers) sets many samples, and the p99.
require_relative "oobgc_matrix"

module OobgcP99
  extend self

  def run(argv)
    opts = { shapes: OobgcMatrix::SHAPES.keys, servers: OobgcMatrix::SERVERS.keys, rounds: 3, duration: 8,
             connections: 4, load: 0.6 }
    OptionParser.new do |o|
      o.on("--shapes LIST", Array) { |v| opts[:shapes] = v }
      o.on("--servers LIST", Array) { |v| opts[:servers] = v }
      o.on("--rounds N", Integer) { |v| opts[:rounds] = v }
      o.on("--duration S", Integer) { |v| opts[:duration] = v }
      o.on("--pin", "servers on CPU 0, wrk on CPU 1 (OobgcMatrix#pin!)") { opts[:pin] = true }
    end.parse!(argv)
    OobgcMatrix.pin! if opts[:pin]
    abort "wrk not found: script/setup installs it" unless system("command -v wrk >/dev/null")
    puts "oobgc p99: #{RUBY_DESCRIPTION}; 2 workers; wrk -c#{opts[:connections]} -d#{opts[:duration]}s; " \
         "#{opts[:rounds]} rounds pooled#{'; pinned' if opts[:pin]}; started #{Time.now.utc.strftime('%F %T')} UTC"
    rows = []
    met = []
    fast = []
    placed = []
    lean = []
    opts[:shapes].each do |shape|
      opts[:servers].each do |name|
        kind, close = OobgcMatrix::SERVERS.fetch(name)
        modes = kind == :puma ? %w[none memkit memkit_plugin] : %w[none memkit]
        base = OobgcBenchRunner.parse_wrk(measure(kind, close, shape, "none", 0, opts).first)
        cycle_ms = 1000.0 * opts[:connections] / [base[:rps] * opts[:load], 0.1].max
        pace = [(cycle_ms - base[:p50].to_f).round, 1].max
        hists = Hash.new { |h, k| h[k] = Hash.new(0) }
        runs = Hash.new { |h, k| h[k] = [] }
        rates = Hash.new { |h, k| h[k] = [] }
        workers = Hash.new { |h, k| h[k] = [] }
        opts[:rounds].times do |round|
          modes.rotate(round).each do |mode|
            out, hist, saturated, probes = measure(kind, close, shape, mode, pace, opts)
            workers[mode].concat(probes)
            hist.each { |usec, count| hists[mode][usec] += count }
            runs[mode] << OobgcBenchRunner.parse_wrk(out)[:p99]
            rates[mode] << OobgcBenchRunner.parse_wrk(saturated)[:rps]
            $stderr.puts format("%s %s %s %s round %d: p99 %.1f ms, %.0f req/s saturated", Time.now.utc.strftime("%T"),
                                name, shape, mode, round, runs[mode].last.to_f, rates[mode].last.to_f)
          end
        end
        none = OobgcBenchRunner.percentile(hists["none"], 99)
        none_rps = rates["none"].sum / rates["none"].size
        none_rss = rss(workers["none"])
        modes.each do |mode|
          p99 = OobgcBenchRunner.percentile(hists[mode], 99)
          rps = rates[mode].sum / rates[mode].size # every run lasts `duration`: the pooled rate
          gcs = workers[mode].sum { |w| w["gc_total"] }
          out_share = gcs.zero? ? 1.0 : 1 - workers[mode].sum { |w| w["gc_inside"] }.fdiv(gcs)
          majors_inside = workers[mode].sum { |w| w["gc_inside_major"] }
          unless mode == "none"
            met << (p99 <= none)
            fast << (rps >= 0.95 * none_rps)
            placed << (out_share >= 0.9)
            lean << (rss(workers[mode]) <= 1.3 * none_rss)
          end
          rows << [name, shape, mode, pace, format("%.1f", OobgcBenchRunner.percentile(hists[mode], 50)),
                   format("%.1f", p99), format("%.1f", OobgcBenchRunner.percentile(hists[mode], 99.9)),
                   format("%.2f", p99 / none), runs[mode].map { |v| format("%.1f", v.to_f) }.join(" "),
                   format("%.0f", rps), format("%.2f", rps / none_rps), format("%.1f", 100 * out_share), majors_inside,
                   workers[mode].size, format("%.2f", rss(workers[mode]) / none_rss)]
        end
      end
    end
    puts Memkit::CLI.table(%w[server shape mode pace_ms p50_ms p99_ms p99.9_ms p99_x per_round_p99 rps rps_x
                              out_% majors_in workers rss_x], rows, left: [0, 1, 2, 8])
    puts "p99 <= no OobGC's (pooled): #{met.count(true)} of #{met.size} memkit cells"
    puts "throughput >= 0.95x no OobGC's (pooled): #{fast.count(true)} of #{fast.size} memkit cells"
    puts ">= 90% of GC runs out of requests: #{placed.count(true)} of #{placed.size}; " \
         "RSS per worker <= 1.3x no OobGC's: #{lean.count(true)} of #{lean.size}"
  end

  # The workers' mean RSS, in kB, from their probes.
  def rss(workers) = workers.sum { |w| w["rss_kb"] }.fdiv([workers.size, 1].max)

  # One fresh server, paced by `pace` ms (0: saturated), then saturated as
  # long. Returns the paced run's wrk output and latency histogram ({usec =>
  # count}), the saturated run's output (nil where `pace` is 0), and the
  # workers' probes.
  def measure(kind, close, shape, mode, pace, opts)
    Dir.mktmpdir("memkit-oobgc-p99") do |dir|
      path = File.join(dir, "latency.txt")
      extra = mode == "memkit_plugin" ? "plugin :memkit" : ""
      saturated = nil
      out = OobgcMatrix.serve(kind, shape, OobgcMatrix.app_source(mode, dir), dir, opts, close, extra: extra) do |url|
        paced = OobgcMatrix.wrk(url, opts[:duration], opts, pace, close, path)
        saturated = OobgcMatrix.wrk(url, opts[:duration], opts, 0, close, nil) if pace.positive?
        paced
      end
      [out, File.readlines(path).to_h { |line| line.split.map(&:to_i) }, saturated, OobgcMatrix.probes(dir)]
    end
  end
end

OobgcP99.run(ARGV) if $PROGRAM_NAME == __FILE__
