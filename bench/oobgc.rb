# frozen_string_literal: true

# Out-of-band GC on real servers: Unicorn and Puma (cluster), 2 workers each,
# a GC-heavy app (bench/oobgc_app.rb), driven by wrk.
#
#   bundle exec ruby -Ilib bench/oobgc.rb [--duration 10] [--pace 40] [--connections 4] [--rounds 1]
#                                         [--servers unicorn,puma] [--modes none,memkit,...]
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
#
# Two loads per mode, each on a freshly booted server after a warm-up:
#   paced      each wrk connection waits --pace ms between a response and its
#              next request, so workers have idle moments as in production
#              (about half busy with the defaults);
#              gives latency and where GC ran (inside vs outside requests)
#   saturated  no pause: the most requests per second the workers can serve
#
# GC placement is counted by a probe middleware in the app (OobgcBench::Probe),
# not by Memkit::OobGC's own counters, so every mode is measured the same way.
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

  MODES = { unicorn: %w[none unicorn_oobgc memkit], puma: %w[none unicorn_oobgc puma_out_of_band memkit_reply memkit] }.freeze
  APP = File.expand_path("oobgc_app.rb", __dir__)
  PACE = File.expand_path("oobgc_pace.lua", __dir__)

  def run(argv)
    opts = { duration: 10, pace: 40, connections: 4, rounds: 1, warmup: 3, servers: %i[unicorn puma], modes: nil }
    OptionParser.new do |o|
      o.on("--duration S", Integer) { |v| opts[:duration] = v }
      o.on("--pace MS", Integer) { |v| opts[:pace] = v }
      o.on("--connections N", Integer) { |v| opts[:connections] = v }
      o.on("--rounds N", Integer) { |v| opts[:rounds] = v }
      o.on("--warmup S", Integer) { |v| opts[:warmup] = v }
      o.on("--servers LIST", Array) { |v| opts[:servers] = v.map(&:to_sym) }
      o.on("--modes LIST", Array) { |v| opts[:modes] = v }
    end.parse!(argv)
    abort "wrk not found (apt install wrk)" unless system("command -v wrk >/dev/null")

    puts "oobgc bench: #{Etc.nprocessors} cpus, #{RUBY_DESCRIPTION}, 2 workers, 1 thread per Puma worker, " \
         "wrk -t2 -c#{opts[:connections]} -d#{opts[:duration]}s, pace #{opts[:pace]} ms, rounds #{opts[:rounds]}"
    results = Hash.new { |h, k| h[k] = [] }
    opts[:rounds].times do
      opts[:servers].each do |server|
        MODES.fetch(server).each do |mode|
          next if opts[:modes] && !opts[:modes].include?(mode)

          %i[paced saturated].each { |load| results[[server, mode, load]] << measure(server, mode, load, opts) }
        end
      end
    end
    report(results, opts)
  end

  def measure(server, mode, load, opts)
    Dir.mktmpdir("memkit-oobgc") do |dir|
      extra = { "puma_out_of_band" => "out_of_band { GC.start }",
                "memkit" => server == :puma ? "out_of_band { Memkit::OobGC.out_of_band }" : "" }.fetch(mode, "")
      srv = start_server(server, app_source(mode, dir), dir: dir, port: free_port, extra: extra)
      begin
        url = "http://127.0.0.1:#{srv.port}/"
        wrk(url, opts[:warmup], opts, load)
        FileUtils.touch(File.join(dir, "reset"))
        sleep 0.5 # the probes look for the reset file every 0.2 s, at their next request
        wrk(url, 1, opts, load) # one second so every worker sees the reset before measuring
        FileUtils.touch(File.join(dir, "reset"))
        sleep 0.5
        out = wrk(url, opts[:duration], opts, load)
      ensure
        stop_server(srv)
      end
      probes = Dir[File.join(dir, "gc-*.json")].map { |f| JSON.parse(File.read(f)) }
      parse_wrk(out).merge(
        gc_total: probes.sum { |p| p["gc_total"] }, gc_inside: probes.sum { |p| p["gc_inside"] },
        gc_ms: probes.sum { |p| p["gc_ms"] }, probe_requests: probes.sum { |p| p["requests"] }, workers_reported: probes.size
      )
    end
  end

  def free_port = Memkit::Loopback.free_port

  def app_source(mode, dir)
    middleware =
      case mode
      when "unicorn_oobgc" then %(require "unicorn"\nrequire "unicorn/oob_gc"\nuse Unicorn::OobGC, 5)
      when "memkit", "memkit_reply" then "use Memkit::OobGC"
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

  def wrk(url, seconds, opts, load)
    cmd = ["wrk", "-t2", "-c#{opts[:connections]}", "-d#{seconds}s", "--latency", "--timeout", "10s"]
    cmd += ["-s", PACE] if load == :paced
    out = IO.popen({ "OOBGC_PACE_MS" => opts[:pace].to_s }, [*cmd, url], err: %i[child out], &:read)
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

  def median(values)
    sorted = values.compact.sort
    sorted.empty? ? nil : sorted[sorted.size / 2]
  end

  def summary(runs)
    keys = runs.first.keys
    keys.to_h { |k| [k, median(runs.map { |r| r[k] })] }
  end

  def report(results, opts)
    rows = results.map { |(server, mode, load), runs| [server, mode, load, summary(runs)] }
    header = %w[server mode load req/s p50_ms p90_ms p99_ms errors gc_runs inside outside%]
    table = rows.map do |server, mode, load, r|
      outside = r[:gc_total].to_i.zero? ? "-" : format("%.1f", 100.0 * (r[:gc_total] - r[:gc_inside]) / r[:gc_total])
      [server, mode, load, format("%.1f", r[:rps]), format("%.1f", r[:p50]), format("%.1f", r[:p90]),
       format("%.1f", r[:p99]), r[:errors], r[:gc_total], r[:gc_inside], outside]
    end
    puts Memkit::CLI.table(header, table, left: [0, 1, 2])
    puts
    puts "Ratios (memkit vs the others; medians over #{opts[:rounds]} round(s)):"
    get = ->(server, mode, load) { rows.find { |s, m, l, _| s == server && m == mode && l == load }&.last }
    opts[:servers].each do |server|
      mk_paced = get.(server, "memkit", :paced)
      mk_sat = get.(server, "memkit", :saturated)
      next unless mk_paced && mk_sat

      outside = mk_paced[:gc_total].zero? ? 1.0 : (mk_paced[:gc_total] - mk_paced[:gc_inside]).fdiv(mk_paced[:gc_total])
      puts format("  %-7s memkit GC runs outside requests (paced): %.1f%% of %d", server, 100 * outside, mk_paced[:gc_total])
      (MODES.fetch(server) - ["memkit"]).each do |other|
        o_paced = get.(server, other, :paced)
        o_sat = get.(server, other, :saturated)
        next unless o_paced && o_sat

        puts format("  %-7s vs %-16s p99 paced %.2fx, p99 saturated %.2fx, throughput saturated %.2fx, throughput paced %.2fx",
                    server, other, mk_paced[:p99] / o_paced[:p99], mk_sat[:p99] / o_sat[:p99],
                    mk_sat[:rps] / o_sat[:rps], mk_paced[:rps] / o_paced[:rps])
      end
    end
  end
end

require "memkit/cli" # Memkit::CLI.table
OobgcBenchRunner.run(ARGV) if $PROGRAM_NAME == __FILE__
