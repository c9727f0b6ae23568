# frozen_string_literal: true

# Out-of-band GC on real servers: Unicorn and Puma (cluster), 2 workers each,
# a GC-heavy app (bench/oobgc_app.rb), driven by wrk.
#
#   bundle exec ruby -Ilib bench/oobgc.rb [--duration 10] [--pace 40] [--connections 4] [--rounds 1]
#                                         [--servers unicorn,puma] [--modes none,memkit,...] [--close]
#
# Modes, side by side on each server:
#   none              no out-of-band GC
#   unicorn_oobgc     Unicorn::OobGC (GC.start every 5 requests, by extending
#                     Unicorn's server object; under Puma it finds no Unicorn
#                     server and does nothing, which the run shows)
#   puma_out_of_band  Puma's own hook: out_of_band { GC.start } (Puma only)
#   memkit            use Memkit::OobGC; on Puma also its out_of_band hook
#                     (what `plugin :memkit` adds), where the GC runs while
#                     the worker accepts nothing
#   memkit_reply      Puma only: use Memkit::OobGC without the hook, the GC
#                     running in rack.after_reply
#   memkit_close      Puma only: memkit, with Puma's `enable_keep_alives false`
#                     (Puma closes each connection after its response, whatever
#                     the client asked), the set-up docs/SERVERS.md suggests
#                     for kept-alive clients
#
# Two loads per mode, each on a freshly booted server after a warm-up:
#   paced      each wrk connection waits --pace ms between a response and its
#              next request, so workers have idle moments as in production
#              (about half busy with the defaults);
#              gives latency and where GC ran (inside vs outside requests)
#   saturated  no pause: the most requests per second the workers can serve
#
# Connections: wrk keeps them alive unless --close, which sends
# "Connection: close" so every request comes on a new connection, as ab does
# without -k and nginx does to its upstream by default. Unicorn closes every
# connection either way; on Puma a kept-alive connection stays with its
# worker, and a request on it waits out any pause there, GC or not.
#
# GC placement is counted by a probe middleware in the app (OobgcBench::Probe),
# not by Memkit::OobGC's own counters, so every mode is measured the same way.
#
# Each round runs every mode once, in a different order per round, so a slow
# minute on the machine does not land on one mode. Latency percentiles are
# taken over the pooled wrk histograms of all rounds (a round's own p99 rests
# on a handful of requests); throughput is pooled requests over pooled
# seconds. The report also gives, per round, whether memkit's p99 was below
# the other mode's, and the workers' CPU time per request (the load-independent
# side of throughput).
require "optparse"
require "json"
require "tmpdir"
require_relative "../lib/memkit/loopback"
require "fileutils"
require "etc"
require_relative "../test/support/servers"

module OobgcBenchRunner
  include Memkit::ServersHelper
  extend self

  MODES = { unicorn: %w[none unicorn_oobgc memkit],
            puma: %w[none unicorn_oobgc puma_out_of_band memkit_reply memkit memkit_close] }.freeze
  APP = File.expand_path("oobgc_app.rb", __dir__)
  # Puma config: the workers write the probe's figures before they stop
  # (OobgcBench::Probe says why at_exit is not enough); the hook's name
  # changed in Puma 7.
  PUMA_FLUSH = <<~RUBY
    public_send(respond_to?(:before_worker_shutdown) ? :before_worker_shutdown : :on_worker_shutdown) do
      OobgcBench::Probe.flush
    end
  RUBY
  WRK_SCRIPT = File.expand_path("oobgc.lua", __dir__)

  def run(argv)
    opts = { duration: 10, pace: 40, connections: 4, rounds: 1, warmup: 3, servers: %i[unicorn puma], modes: nil,
             close: false }
    OptionParser.new do |o|
      o.on("--duration S", Integer) { |v| opts[:duration] = v }
      o.on("--pace MS", Integer) { |v| opts[:pace] = v }
      o.on("--connections N", Integer) { |v| opts[:connections] = v }
      o.on("--rounds N", Integer) { |v| opts[:rounds] = v }
      o.on("--warmup S", Integer) { |v| opts[:warmup] = v }
      o.on("--servers LIST", Array) { |v| opts[:servers] = v.map(&:to_sym) }
      o.on("--modes LIST", Array) { |v| opts[:modes] = v }
      o.on("--close", "one request per connection") { opts[:close] = true }
    end.parse!(argv)
    abort "wrk not found: script/setup installs it" unless system("command -v wrk >/dev/null")

    puts "oobgc bench: #{Etc.nprocessors} cpus, #{RUBY_DESCRIPTION}, 2 workers, 1 thread per Puma worker, " \
         "wrk -t2 -c#{opts[:connections]} -d#{opts[:duration]}s, pace #{opts[:pace]} ms, rounds #{opts[:rounds]}, " \
         "#{opts[:close] ? 'Connection: close' : 'keep-alive'}"
    results = Hash.new { |h, k| h[k] = [] }
    opts[:rounds].times do |round|
      opts[:servers].each do |server|
        modes = MODES.fetch(server).select { |m| opts[:modes].nil? || opts[:modes].include?(m) }
        modes.rotate(round % modes.size).each do |mode|
          %i[paced saturated].each { |load| results[[server, mode, load]] << measure(server, mode, load, opts) }
        end
      end
    end
    report(results, opts)
  end

  def measure(server, mode, load, opts)
    Dir.mktmpdir("memkit-oobgc") do |dir|
      hook = "out_of_band { Memkit::OobGC.out_of_band }"
      extra = { "puma_out_of_band" => "out_of_band { GC.start }", "memkit" => server == :puma ? hook : "",
                "memkit_close" => "#{hook}\nenable_keep_alives false" }.fetch(mode, "")
      extra += "\n#{PUMA_FLUSH}" if server == :puma
      srv = start_server(server, app_source(mode, dir), dir: dir, port: free_port, extra: extra)
      begin
        url = "http://127.0.0.1:#{srv.port}/"
        wrk(url, opts[:warmup], opts, load)
        FileUtils.touch(File.join(dir, "reset"))
        sleep 0.5 # the probes look for the reset file every 0.2 s, at their next request
        wrk(url, 1, opts, load) # one second so every worker sees the reset before measuring
        FileUtils.touch(File.join(dir, "reset"))
        sleep 0.5
        out = wrk(url, opts[:duration], opts, load, hist: File.join(dir, "latency.txt"))
      ensure
        stop_server(srv)
      end
      probes = Dir[File.join(dir, "gc-*.json")].map { |f| JSON.parse(File.read(f)) }
      parse_wrk(out).merge(
        hist: File.readlines(File.join(dir, "latency.txt")).to_h { |l| l.split.map(&:to_i) }, seconds: opts[:duration],
        gc_total: probes.sum { |p| p["gc_total"] }, gc_inside: probes.sum { |p| p["gc_inside"] },
        gc_major: probes.sum { |p| p["gc_major"] },
        gc_ms: probes.sum { |p| p["gc_ms"] }, cpu_ms: probes.sum { |p| p["cpu_ms"] },
        probe_requests: probes.sum { |p| p["requests"] }, workers_reported: probes.size
      )
    end
  end

  def free_port = Memkit::Loopback.free_port

  def app_source(mode, dir)
    middleware =
      case mode
      when "unicorn_oobgc" then %(require "unicorn"\nrequire "unicorn/oob_gc"\nuse Unicorn::OobGC, 5)
      when "memkit", "memkit_reply", "memkit_close" then "use Memkit::OobGC"
      else ""
      end
    <<~RUBY
      require "memkit"
      require #{APP.inspect}
      use OobgcBench::Probe, #{dir.inspect}
      #{middleware}
      run ->(_env) { [200, { "content-type" => "text/plain" }, [OobgcBench.render]] }
    RUBY
  end

  def wrk(url, seconds, opts, load, hist: nil)
    cmd = ["wrk", "-t2", "-c#{opts[:connections]}", "-d#{seconds}s", "--latency", "--timeout", "10s", "-s", WRK_SCRIPT]
    cmd += ["-H", "Connection: close"] if opts[:close]
    env = { "OOBGC_PACE_MS" => (load == :paced ? opts[:pace] : 0).to_s, "OOBGC_HIST" => hist }
    out = IO.popen(env, [*cmd, url], err: %i[child out], &:read)
    raise "wrk failed:\n#{out}" unless $?.success?

    out
  end

  def parse_wrk(out)
    latency = out.scan(/^\s+(50|75|90|99)%\s+([\d.]+)(us|ms|s)\b/).to_h do |pct, value, unit|
      [pct.to_i, value.to_f * { "us" => 0.001, "ms" => 1.0, "s" => 1000.0 }.fetch(unit)]
    end
    {
      rps: out[/Requests\/sec:\s+([\d.]+)/, 1].to_f, p50: latency[50], p90: latency[90], p99: latency[99],
      requests: out[/(\d+) requests in/, 1].to_i,
      errors: out[/Socket errors:.*$/].to_s.scan(/\d+/).sum(&:to_i) + out[/Non-2xx or 3xx responses: (\d+)/, 1].to_i
    }
  end

  # The pct-th percentile of a wrk histogram ({usec => count}), in ms.
  def percentile(hist, pct)
    rank = (hist.values.sum * pct / 100.0).ceil
    seen = 0
    hist.keys.sort.each do |usec|
      seen += hist[usec]
      return usec / 1000.0 if seen >= rank
    end
    nil
  end

  def pool(runs)
    hist = Hash.new(0)
    runs.each { |r| r[:hist].each { |usec, count| hist[usec] += count } }
    sum = ->(key) { runs.sum { |r| r[key] } }
    {
      rps: sum.(:requests).fdiv(sum.(:seconds)), p50: percentile(hist, 50), p90: percentile(hist, 90),
      p99: percentile(hist, 99), p999: percentile(hist, 99.9), errors: sum.(:errors),
      gc_total: sum.(:gc_total), gc_inside: sum.(:gc_inside), gc_major: sum.(:gc_major), gc_ms: sum.(:gc_ms),
      cpu_per_request: sum.(:cpu_ms).fdiv(sum.(:probe_requests))
    }
  end

  def report(results, opts)
    pooled = results.transform_values { |runs| pool(runs) }
    header = %w[server mode load req/s p50_ms p90_ms p99_ms p99.9_ms errors gc_runs majors inside outside% ms/gc cpu_ms/req]
    table = pooled.map do |(server, mode, load), r|
      outside = r[:gc_total].zero? ? "-" : format("%.1f", 100.0 * (r[:gc_total] - r[:gc_inside]) / r[:gc_total])
      [server, mode, load, format("%.1f", r[:rps]), *r.values_at(:p50, :p90, :p99, :p999).map { |v| format("%.1f", v) },
       r[:errors], r[:gc_total], r[:gc_major], r[:gc_inside], outside, format("%.1f", r[:gc_ms].fdiv([r[:gc_total], 1].max)),
       format("%.2f", r[:cpu_per_request])]
    end
    puts Memkit::CLI.table(header, table, left: [0, 1, 2])
    puts
    puts "Ratios, memkit vs the others (pooled over #{opts[:rounds]} round(s); " \
         "'below in k/n' = rounds where its own p99 was below the other's in the same round):"
    opts[:servers].each do |server|
      %w[memkit memkit_close].each do |subject|
        mk = ->(load) { pooled[[server, subject, load]] }
        next unless mk.(:paced) && mk.(:saturated)

        %i[paced saturated].each do |load|
          r = mk.(load)
          puts format("  %-7s %s GC runs outside requests (%s): %.1f%% of %d", server, subject, load,
                      100.0 * (r[:gc_total] - r[:gc_inside]) / [r[:gc_total], 1].max, r[:gc_total])
        end
        # memkit_close is compared only with what it would replace.
        others = subject == "memkit" ? MODES.fetch(server) - %w[memkit memkit_close] : %w[none memkit]
        others.each { |other| compare(results, pooled, server, subject, other) }
      end
    end
  end

  def compare(results, pooled, server, subject, other)
    mk = ->(load) { pooled[[server, subject, load]] }
    o = ->(load) { pooled[[server, other, load]] }
    return unless o.(:paced) && o.(:saturated)

    wins = ->(load) do
      pairs = results[[server, subject, load]].zip(results[[server, other, load]])
      "#{pairs.count { |m, x| percentile(m[:hist], 99) < percentile(x[:hist], 99) }}/#{pairs.size}"
    end
    ratio = ->(load, key) { mk.(load)[key] / o.(load)[key] }
    puts format("  %-7s %s vs %-16s p99 paced %.2fx (below in %s), p99 saturated %.2fx (below in %s), " \
                "throughput saturated %.2fx, paced %.2fx, CPU per request saturated %.2fx",
                server, subject, other, ratio.(:paced, :p99), wins.(:paced), ratio.(:saturated, :p99), wins.(:saturated),
                ratio.(:saturated, :rps), ratio.(:paced, :rps), ratio.(:saturated, :cpu_per_request))
  end
end

require "memkit/cli" # Memkit::CLI.table
OobgcBenchRunner.run(ARGV) if $PROGRAM_NAME == __FILE__
