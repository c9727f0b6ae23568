# frozen_string_literal: true

# Memkit::OobGC across app shapes and servers: where GC runs, what it costs.
#
#   flock /tmp/memkit-bench.lock bundle exec ruby -Ilib bench/oobgc_matrix.rb \
#     [--shapes tiny,medium,...] [--servers unicorn,puma,puma_close] [--duration 4] [--connections 4]
#
# Each cell boots a fresh server (2 workers, 1 thread per Puma worker) with
# bench/oobgc_app.rb shaped by environment variables, and drives it with wrk:
#   saturated  no pause between requests (throughput)
#   paced      each connection pauses so the workers are ~60% busy, from the
#              saturated throughput of the same shape and server without OobGC
#              (p99 latency)
# Modes: none (no OobGC); memkit (`use Memkit::OobGC`, no plugin); on Puma
# also memkit_plugin (`plugin :memkit`: the out_of_band hook and warmup).
# puma_close: Puma with wrk sending "Connection: close" (one request per
# connection); puma and unicorn: kept-alive connections.
#
# The probe (OobgcBench::Probe) counts from each worker's 101st request:
# GC runs in all, inside requests, majors inside requests, and the worker's
# RSS at exit.
require_relative "oobgc"

module OobgcMatrix
  extend self

  SHAPES = {
    "tiny" => { "OOBGC_ROWS" => "150" },                                   # ~1.2k objects / request
    "medium" => { "OOBGC_ROWS" => "1500" },                                # ~12k
    "large" => { "OOBGC_ROWS" => "8000" },                                 # ~64k
    "huge" => { "OOBGC_ROWS" => "36000" },                                 # ~290k
    "malloc" => { "OOBGC_ROWS" => "300", "OOBGC_MALLOC_KB" => "8192" },    # ~2.4k objects, 8 MiB malloc
    "promoting" => { "OOBGC_ROWS" => "1500", "OOBGC_KEEP" => "20" },       # rows live 20 requests: majors
    "cache" => { "OOBGC_ROWS" => "1500", "OOBGC_GROW" => "40" }            # retained cache grows per request
  }.freeze
  SERVERS = { "unicorn" => [:unicorn, false], "puma" => [:puma, false], "puma_close" => [:puma, true] }.freeze

  def run(argv)
    opts = { shapes: SHAPES.keys, servers: SERVERS.keys, duration: 4, connections: 4, load: 0.6 }
    OptionParser.new do |o|
      o.on("--shapes LIST", Array) { |v| opts[:shapes] = v }
      o.on("--servers LIST", Array) { |v| opts[:servers] = v }
      o.on("--duration S", Integer) { |v| opts[:duration] = v }
      o.on("--connections N", Integer) { |v| opts[:connections] = v }
    end.parse!(argv)
    puts "oobgc matrix: #{RUBY_DESCRIPTION}; 2 workers; wrk -c#{opts[:connections]} -d#{opts[:duration]}s; " \
         "counted from each worker's 101st request"
    rows = []
    summary = []
    opts[:shapes].each do |shape|
      opts[:servers].each do |name|
        kind, close = SERVERS.fetch(name)
        modes = kind == :puma ? %w[none memkit memkit_plugin] : %w[none memkit]
        cells = {}
        base = cell(kind, close, shape, "none", 0, opts)
        cycle_ms = 1000.0 * opts[:connections] / [base[:rps] * opts[:load], 0.1].max
        pace = [(cycle_ms - base[:p50]).round, 1].max
        cells[["none", :saturated]] = base
        modes.each do |mode|
          cells[[mode, :saturated]] ||= cell(kind, close, shape, mode, 0, opts)
          cells[[mode, :paced]] = cell(kind, close, shape, mode, pace, opts)
        end
        cells.each { |(mode, load), r| rows << row(name, shape, mode, load, r) }
        (modes - ["none"]).each do |mode|
          sat = cells[[mode, :saturated]]
          paced = cells[[mode, :paced]]
          summary << [name, shape, mode, pct(paced), pct(sat), paced[:gc_inside_major] + sat[:gc_inside_major],
                      format("%.2f", sat[:rps] / cells[["none", :saturated]][:rps]),
                      format("%.2f", paced[:p99] / cells[["none", :paced]][:p99]),
                      format("%.2f", paced[:rss_kb].fdiv(cells[["none", :paced]][:rss_kb])),
                      format("%.2f", (paced[:gc_total] + sat[:gc_total]).fdiv(paced[:requests_counted] + sat[:requests_counted]) /
                                     [(cells[["none", :paced]][:gc_total] + cells[["none", :saturated]][:gc_total])
                                      .fdiv(cells[["none", :paced]][:requests_counted] + cells[["none", :saturated]][:requests_counted]), 1e-9].max),
                      paced[:gave_up] || sat[:gave_up] || "-"]
        end
        $stdout.flush
      end
    end
    header = %w[server shape mode load req/s p50_ms p99_ms gc_runs inside inside_major outside% rss_MB/worker grown_MB]
    puts Memkit::CLI.table(header, rows, left: [0, 1, 2, 3])
    puts
    puts "Per cell, memkit mode vs none (same server and shape): % of GC runs outside requests (paced, saturated), " \
         "majors inside requests, throughput at saturation, p99 at ~#{(opts[:load] * 100).round}% load, " \
         "RSS per worker (paced), GC runs per request:"
    puts Memkit::CLI.table(%w[server shape mode out%_paced out%_sat majors_inside rps_x p99_x rss_x gc/req_x gave_up],
                           summary, left: [0, 1, 2, 10])
  end

  def cell(kind, close, shape, mode, pace, opts)
    Dir.mktmpdir("memkit-oobgc-matrix") do |dir|
      extra = mode == "memkit_plugin" ? "plugin :memkit" : ""
      source = OobgcBenchRunner.app_source(mode == "none" ? "none" : "memkit", dir)
      srv = Memkit::ServersHelper.start_server(kind, source, dir: dir, port: Memkit::Loopback.free_port,
                                                       env: SHAPES.fetch(shape).merge("OOBGC_SKIP" => "100"), extra: extra)
      begin
        out = wrk("http://127.0.0.1:#{srv.port}/", opts, pace, close, File.join(dir, "latency.txt"))
      ensure
        Memkit::ServersHelper.stop_server(srv)
      end
      probes = Dir[File.join(dir, "gc-*.json")].map { |f| JSON.parse(File.read(f)) }
      warn "#{kind} #{shape} #{mode}: #{probes.size} of 2 workers reported" if probes.size < 2
      oob = probes.map { |p| p["oob"] }.compact
      OobgcBenchRunner.parse_wrk(out).merge(
        gc_total: probes.sum { |p| p["gc_total"] }, gc_inside: probes.sum { |p| p["gc_inside"] },
        gc_inside_major: probes.sum { |p| p["gc_inside_major"] }, requests_counted: probes.sum { |p| p["requests"] },
        rss_kb: probes.sum { |p| p["rss_kb"] }.fdiv([probes.size, 1].max),
        grown: oob.sum { |o| o["heap_grown_bytes"] }.fdiv([oob.size, 1].max),
        gave_up: oob.map { |o| o["gave_up"] }.compact.first
      )
    end
  end

  def wrk(url, opts, pace, close, hist)
    cmd = ["wrk", "-t2", "-c#{opts[:connections]}", "-d#{opts[:duration]}s", "--latency", "--timeout", "10s",
           "-s", OobgcBenchRunner::WRK_SCRIPT]
    cmd += ["-H", "Connection: close"] if close
    out = IO.popen({ "OOBGC_PACE_MS" => pace.to_s, "OOBGC_HIST" => hist }, [*cmd, url], err: %i[child out], &:read)
    raise "wrk failed:\n#{out}" unless $?.success?

    out
  end

  def pct(r) = r[:gc_total].zero? ? "-" : format("%.1f", 100.0 * (r[:gc_total] - r[:gc_inside]) / r[:gc_total])

  def row(server, shape, mode, load, r)
    [server, shape, mode, load, format("%.1f", r[:rps]), format("%.1f", r[:p50].to_f), format("%.1f", r[:p99].to_f),
     r[:gc_total], r[:gc_inside], r[:gc_inside_major], pct(r), format("%.1f", r[:rss_kb] / 1024.0),
     format("%.1f", r[:grown] / 1048576.0)]
  end
end

OobgcMatrix.run(ARGV) if $PROGRAM_NAME == __FILE__
