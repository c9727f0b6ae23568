# frozen_string_literal: true

# Memkit::OobGC across app shapes and servers: where GC runs, what it costs.
#
#   flock /tmp/memkit-bench.lock bundle exec ruby -Ilib bench/oobgc_matrix.rb \
#     [--shapes tiny,medium,...] [--servers unicorn,puma,puma_close] [--duration 4] [--connections 4] \
#     [--repeat 3] [--out rows.jsonl] [--rev abc1234]
#   bundle exec ruby -Ilib bench/oobgc_matrix.rb --report rows.jsonl[,more.jsonl]   # tables of earlier runs
#
# Each cell boots a fresh server (2 workers, 1 thread per Puma worker) with
# bench/oobgc_app.rb shaped by environment variables, warms it until every
# worker has served 100 requests, zeroes the app's probe, then drives it with
# wrk for --duration seconds:
#   saturated  no pause between requests (throughput)
#   paced      each connection pauses so the workers are ~60% busy, from the
#              saturated throughput of the same shape and server without OobGC
#              (p99 latency)
# Modes: none (no OobGC); memkit (`use Memkit::OobGC`, no plugin); on Puma
# also memkit_plugin (`use Memkit::OobGC` and `plugin :memkit`: the
# out_of_band hook, and the plugin's fork warm-up).
# Servers: unicorn; puma (wrk keeps connections alive); puma_close (wrk sends
# "Connection: close": one request per connection).
#
# --repeat N measures every (mode, load) cell N times, each on a fresh boot,
# the modes in a different order per repeat; the tables give the median of
# req/s, p50, p99 and RSS over the repeats (a single short run's p99 rests on
# a few dozen requests) and the sum of the GC counts.
#
# The probe (OobgcBench::Probe) counts, from the reset after the warm-up: GC
# runs in all, inside requests, majors inside requests, GC time
# (GC.stat(:time)) and CPU time, and the worker's RSS at exit. GC and CPU
# time per request against no OobGC say whether a throughput ratio is
# memkit's cost: wrk's requests per second on a shared 2-core machine move
# by more than that between runs of the same cell. A worker that did not
# reach 100 requests in the warm-up's time cap is reported in the "cold"
# column (a Puma worker that got no kept-alive connection can stay cold).
#
# The report ends with issue 17's lines for the matrix (placement, majors,
# throughput, p99, RSS), each with how many memkit cells meet it and the
# cells that miss it.
#
# --out appends one JSON line per measured cell as soon as it is measured, so
# the matrix can run as several locked runs (one per server and Ruby, each
# under 10 minutes) and be reported together with --report.
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
    "cache" => { "OOBGC_ROWS" => "1500", "OOBGC_GROW" => "40" },           # retained cache grows per request
    "mixed" => { "OOBGC_MIX" => "150:70,1500:25,20000:5" }                 # 150, 1,500 or 20,000 rows: 70/25/5%
  }.freeze
  SERVERS = { "unicorn" => [:unicorn, false], "puma" => [:puma, false], "puma_close" => [:puma, true] }.freeze
  WARM_REQUESTS = 100
  WARM_CAP = 40 # seconds of warm-up at most per cell

  def run(argv)
    opts = { shapes: SHAPES.keys, servers: SERVERS.keys, duration: 4, connections: 4, load: 0.6, repeat: 1,
             out: nil, report: nil, rev: nil }
    OptionParser.new do |o|
      o.on("--shapes LIST", Array) { |v| opts[:shapes] = v }
      o.on("--servers LIST", Array) { |v| opts[:servers] = v }
      o.on("--duration S", Integer) { |v| opts[:duration] = v }
      o.on("--connections N", Integer) { |v| opts[:connections] = v }
      o.on("--repeat N", Integer) { |v| opts[:repeat] = v }
      o.on("--out FILE", "append one JSON line per measured cell") { |v| opts[:out] = v }
      o.on("--report FILES", Array, "print the tables of earlier runs, run nothing") { |v| opts[:report] = v }
      o.on("--rev REV", "the code revision, recorded in each row") { |v| opts[:rev] = v }
    end.parse!(argv)
    if opts[:report]
      return report(opts[:report].flat_map { |f| File.readlines(f).map { |l| JSON.parse(l, symbolize_names: true) } })
    end

    abort "wrk not found: script/setup installs it" unless system("command -v wrk >/dev/null")
    puts "oobgc matrix: #{RUBY_DESCRIPTION}; rev #{opts[:rev] || '?'}; 2 workers; wrk -c#{opts[:connections]} " \
         "-d#{opts[:duration]}s; repeat #{opts[:repeat]}; " \
         "counted after each worker's first #{WARM_REQUESTS} requests; " \
         "started #{Time.now.utc.strftime('%F %T')} UTC"
    rows = []
    opts[:shapes].each do |shape|
      opts[:servers].each do |name|
        rows.concat(server_shape(name, shape, opts))
      end
    end
    report(rows)
  end

  # Every cell of one server and shape: none saturated first (it sets the
  # pace), then each repeat in a rotated mode order.
  def server_shape(name, shape, opts)
    kind, close = SERVERS.fetch(name)
    modes = kind == :puma ? %w[none memkit memkit_plugin] : %w[none memkit]
    rows = []
    measure = lambda do |mode, load, pace, rep|
      r = cell(kind, close, shape, mode, pace, opts)
      row = { ruby: RUBY_VERSION, rev: opts[:rev], server: name, shape: shape, mode: mode, load: load, rep: rep,
              pace_ms: pace, **r }
      File.open(opts[:out], "a") { |f| f.puts(JSON.generate(row)) } if opts[:out]
      cold = r[:cold].positive? ? " COLD #{r[:cold]}" : ""
      $stderr.puts format("%s %s %s %s %s #%d: %.1f req/s p99 %.1f ms, gc %d inside %d (major %d); " \
                          "requests per worker %s%s",
                          Time.now.utc.strftime("%T"), name, shape, mode, load, rep, r[:rps], r[:p99].to_f,
                          r[:gc_total], r[:gc_inside], r[:gc_inside_major], r[:split].join("/"), cold)
      rows << row
      r
    end
    base = measure.call("none", "saturated", 0, 0)
    cycle_ms = 1000.0 * opts[:connections] / [base[:rps] * opts[:load], 0.1].max
    pace = [(cycle_ms - base[:p50].to_f).round, 1].max
    opts[:repeat].times do |rep|
      modes.rotate(rep).each do |mode|
        measure.call(mode, "saturated", 0, rep) unless mode == "none" && rep.zero?
        measure.call(mode, "paced", pace, rep)
      end
    end
    rows
  end

  def cell(kind, close, shape, mode, pace, opts)
    Dir.mktmpdir("memkit-oobgc-matrix") do |dir|
      extra = mode == "memkit_plugin" ? "plugin :memkit" : ""
      warm_seconds = nil
      tree_pss = nil
      out = serve(kind, shape, app_source(mode, dir), dir, opts, close, extra: extra) do |url, warmed, pid|
        warm_seconds = warmed
        result = wrk(url, opts[:duration], opts, pace, close, File.join(dir, "latency.txt"))
        tree_pss = Memkit::Tree.read(pid).total_pss
        result
      end
      probes = OobgcMatrix.probes(dir)
      warn "#{kind} #{shape} #{mode}: #{probes.size} of 2 workers wrote figures (none from a worker that served no request after the reset)" if probes.size < 2
      oob = probes.map { |p| p["oob"] }.compact
      OobgcBenchRunner.parse_wrk(out).merge(
        gc_total: probes.sum { |p| p["gc_total"] }, gc_inside: probes.sum { |p| p["gc_inside"] },
        gc_inside_major: probes.sum { |p| p["gc_inside_major"] }, gc_major: probes.sum { |p| p["gc_major"] },
        requests_counted: probes.sum { |p| p["requests"] }, workers: probes.size,
        split: probes.map { |p| p["requests"] }.sort.reverse,
        gc_ms: probes.sum { |p| p["gc_ms"].to_f }, cpu_ms: probes.sum { |p| p["cpu_ms"].to_f },
        rss_kb: probes.sum { |p| p["rss_kb"] }.fdiv([probes.size, 1].max),
        grown: oob.sum { |o| o["heap_grown_bytes"].to_i }.fdiv([oob.size, 1].max),
        gave_up: oob.map { |o| o["gave_up"] }.compact.first, boot_env: oob.map { |o| o["boot_env"] }.compact.first,
        cold: 2 - Dir[File.join(dir, "warm-*")].size, warm_s: warm_seconds, tree_pss: tree_pss
      )
    end
  end

  # Boots `source` (see #app_source) on a fresh `kind` server (2 workers)
  # with the app shaped as `shape`, warms it until both workers are warm
  # (#warm), zeroes the probes, and yields the URL and the warm-up's
  # seconds; stops the server after the block and returns what it returned.
  def serve(kind, shape, source, dir, opts, close, extra: "")
    extra += "\n#{OobgcBenchRunner::PUMA_FLUSH}" if kind == :puma
    env = SHAPES.fetch(shape).merge("OOBGC_SKIP" => "0")
    srv = Memkit::ServersHelper.start_server(kind, source, dir: dir, port: Memkit::Loopback.free_port, env: env,
                                                           extra: extra)
    url = "http://127.0.0.1:#{srv.port}/"
    begin
      warmed = warm(url, dir, opts, close)
      FileUtils.touch(File.join(dir, "reset"))
      sleep 0.3 # the probe zeroes at its first request once 0.2 s have passed since its last check
      result = yield url, warmed, srv.pid
      # The workers write their figures now: a Puma 8 worker on Ruby 3.3/3.4 can
      # hang closing its pipes at shutdown, before its shutdown hook, and be
      # killed with its figures unwritten (20 of 42 keep-alive Puma cells in
      # one 3.3 matrix).
      Process.kill(:PWR, -srv.pid)
      probes(dir)
      result
    ensure
      Memkit::ServersHelper.stop_server(srv)
    end
  end

  # The workers' probe files (each written whole, by a rename). This waits a
  # little for both, as a worker may still be exiting.
  def probes(dir, workers: 2, wait: 10)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + wait
    files = []
    loop do
      files = Dir[File.join(dir, "gc-*.json")]
      break if files.size >= workers || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

      sleep 0.1
    end
    files.map { |f| JSON.parse(File.read(f)) }
  end

  # The app under test, with a marker outermost that touches DIR/warm-PID
  # once this worker has served WARM_REQUESTS requests.
  def app_source(mode, dir)
    <<~RUBY
      require "memkit"
      require #{OobgcBenchRunner::APP.inspect}
      warm = Class.new do
        def initialize(app, path)
          @app = app
          @path = path
          @n = 0
        end

        def call(env)
          @n += 1
          File.write(format(@path, Process.pid), "") if @n == #{WARM_REQUESTS}
          @app.call(env)
        end
      end
      use warm, #{File.join(dir, 'warm-%d').inspect}
      use OobgcBench::Probe, #{dir.inspect}
      #{mode == 'none' ? '' : 'use Memkit::OobGC'}
      run ->(_env) { [200, { "content-type" => "text/plain" }, [OobgcBench.render]] }
    RUBY
  end

  # Saturated load, one second at a time, until both workers are warm or
  # WARM_CAP seconds have passed. Returns the seconds it took.
  def warm(url, dir, opts, close)
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    loop do
      wrk(url, 1, opts, 0, close, nil)
      elapsed = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
      return elapsed.round(1) if Dir[File.join(dir, "warm-*")].size >= 2 || elapsed > WARM_CAP
    end
  end

  # Puts this process, and so every server it boots from now on, on CPU 0,
  # and wrk on CPU 1 (one thread). Unpinned on this bench's 2-core VM, wrk
  # and the two workers share both cores as the scheduler places them: no
  # OobGC's own throughput moved by more than 20% between two rounds in 16 of
  # 42 server-shape cells, and one worker of a pair often served half the
  # requests of the other at twice its CPU time per request. Pinned, the
  # workers split the requests evenly; the VM's own speed still moves whole
  # rounds (3.4 Unicorn "tiny" without OobGC: 2,191-2,623 req/s over three),
  # so rounds are still pooled. Both modes run pinned alike.
  def pin!
    abort "--pin needs taskset and 2 CPUs" unless Etc.nprocessors >= 2 && system("command -v taskset >/dev/null")
    system("taskset", "-p", "-c", "0", Process.pid.to_s, out: File::NULL, exception: true)
    @pinned = true
  end

  def wrk(url, seconds, opts, pace, close, hist)
    cmd = @pinned ? ["taskset", "-c", "1", "wrk", "-t1"] : ["wrk", "-t2"]
    cmd += ["-c#{opts[:connections]}", "-d#{seconds}s", "--latency", "--timeout", "10s",
            "-s", OobgcBenchRunner::WRK_SCRIPT]
    cmd += ["-H", "Connection: close"] if close
    out = IO.popen({ "OOBGC_PACE_MS" => pace.to_s, "OOBGC_HIST" => hist }, [*cmd, url], err: %i[child out], &:read)
    raise "wrk failed:\n#{out}" unless $?.success?

    out
  end

  def median(values)
    v = values.compact.sort
    return nil if v.empty?

    v.size.odd? ? v[v.size / 2] : (v[v.size / 2 - 1] + v[v.size / 2]) / 2.0
  end

  # Cells pooled over repeats: medians of rates and latencies, sums of counts.
  def pool(list)
    sum = ->(key) { list.sum { |r| r[key].to_i } }
    # Rows recorded before the probes' GC and CPU time were kept have none.
    fsum = ->(key) { list.all? { |r| r[key] } ? list.sum { |r| r[key] } : nil }
    { n: list.size, rps: median(list.map { |r| r[:rps] }), p50: median(list.map { |r| r[:p50] }),
      p99: median(list.map { |r| r[:p99] }), p99s: list.map { |r| r[:p99] },
      rss_kb: median(list.map { |r| r[:rss_kb] }), grown: median(list.map { |r| r[:grown] }),
      # Rows recorded before the matrix read the tree have no tree_pss.
      tree_pss: (median(list.map { |r| r[:tree_pss] }) if list.all? { |r| r[:tree_pss] }),
      gc_total: sum.(:gc_total), gc_inside: sum.(:gc_inside), gc_inside_major: sum.(:gc_inside_major),
      gc_major: sum.(:gc_major), requests_counted: sum.(:requests_counted), cold: sum.(:cold),
      errors: sum.(:errors), gc_ms: fsum.(:gc_ms), cpu_ms: fsum.(:cpu_ms),
      gave_up: list.map { |r| r[:gave_up] }.compact.first,
      boot_env: list.map { |r| r[:boot_env] }.compact.first }
  end

  def pct(r) = r[:gc_total].zero? ? "-" : format("%.1f", 100.0 * (r[:gc_total] - r[:gc_inside]) / r[:gc_total])

  def report(rows)
    verdicts = []
    rows.group_by { |r| [r[:ruby], r[:server]] }.each do |(ruby, server), list|
      revs = list.map { |r| r[:rev] }.uniq.join(",")
      puts "== Ruby #{ruby}, #{server} (rev #{revs})"
      cells = list.group_by { |r| [r[:shape], r[:mode], r[:load]] }.transform_values { |l| pool(l) }
      header = %w[shape mode load n req/s p50_ms p99_ms gc_runs majors inside inside_major outside% rss_MB/worker
                  tree_pss_MB grown_MB cold]
      table = cells.map do |(shape, mode, load), r|
        [shape, mode, load, r[:n], format("%.1f", r[:rps]), format("%.1f", r[:p50].to_f), format("%.1f", r[:p99].to_f),
         r[:gc_total], r[:gc_major], r[:gc_inside], r[:gc_inside_major], pct(r), format("%.1f", r[:rss_kb] / 1024.0),
         r[:tree_pss] ? format("%.1f", r[:tree_pss] / 1048576.0) : "-", format("%.1f", r[:grown].to_f / 1048576.0),
         r[:cold]]
      end
      puts Memkit::CLI.table(header, table, left: [0, 1, 2])
      puts
      summary = list.map { |r| [r[:shape], r[:mode]] }.uniq.reject { |_, m| m == "none" }.filter_map do |shape, mode|
        get = ->(m, load) { cells[[shape, m, load]] }
        next unless [[mode, "saturated"], [mode, "paced"], %w[none saturated], %w[none paced]].all? { |k| get.(*k) }

        per_req = lambda do |m, key = :gc_total|
          a = get.(m, "saturated")
          b = get.(m, "paced")
          next nil unless a[key] && b[key]

          (a[key] + b[key]).fdiv([a[:requests_counted] + b[:requests_counted], 1].max)
        end
        ratio = lambda do |key|
          mine = per_req.(mode, key)
          base = per_req.("none", key)
          mine && base&.positive? ? mine / base : nil
        end
        sat = get.(mode, "saturated")
        paced = get.(mode, "paced")
        verdict = { cell: "#{ruby} #{server} #{shape} #{mode}", out: [pct(paced), pct(sat)],
                    majors_inside: paced[:gc_inside_major] + sat[:gc_inside_major],
                    rps_x: sat[:rps] / get.("none", "saturated")[:rps],
                    p99_x: paced[:p99].to_f / get.("none", "paced")[:p99].to_f,
                    rss_x: paced[:rss_kb].fdiv(get.("none", "paced")[:rss_kb]),
                    pss_x: (paced[:tree_pss].fdiv(get.("none", "paced")[:tree_pss]) if paced[:tree_pss] &&
                                                                                          get.("none", "paced")[:tree_pss]),
                    gc_x: per_req.(mode) / [per_req.("none"), 1e-9].max,
                    gc_ms_x: ratio.(:gc_ms), cpu_x: ratio.(:cpu_ms) }
        verdicts << verdict
        [shape, mode, *verdict[:out], verdict[:majors_inside], format("%.2f", verdict[:rps_x]),
         format("%.2f", verdict[:p99_x]), format("%.2f", verdict[:rss_x]),
         verdict[:pss_x] ? format("%.2f", verdict[:pss_x]) : "-", format("%.2f", verdict[:gc_x]),
         *verdict.values_at(:gc_ms_x, :cpu_x).map { |x| x ? format("%.2f", x) : "-" },
         paced[:gave_up] || sat[:gave_up] || "-"]
      end
      puts "#{server}, Ruby #{ruby}: memkit mode vs none: % of GC runs outside requests (paced, saturated), " \
           "majors inside requests, throughput at saturation (median), p99 at ~60% load (median), " \
           "RSS per worker and the server tree's PSS after the load (paced, median), GC runs, GC time and " \
           "CPU time per request:"
      puts Memkit::CLI.table(%w[shape mode out%_paced out%_sat majors_inside rps_x p99_x rss_x tree_pss_x gc/req_x
                                gc_ms/req_x cpu/req_x gave_up], summary, left: [0, 1, 12])
      puts
    end
    lines(verdicts)
  end

  # Issue 17's lines for the matrix, each with the cells that miss it.
  LINES = [
    # "-": no GC ran at all.
    [">= 90% of GC runs out of requests", ->(v) { v[:out].all? { |o| o == "-" || o.to_f >= 90 } }, :out],
    ["no major GC inside requests", ->(v) { v[:majors_inside].zero? }, :majors_inside],
    ["throughput >= 0.95x no OobGC (saturated)", ->(v) { v[:rps_x] >= 0.95 }, :rps_x],
    ["p99 <= no OobGC's (~60% load)", ->(v) { v[:p99_x] <= 1.0 }, :p99_x],
    ["RSS per worker <= 1.3x no OobGC", ->(v) { v[:rss_x] <= 1.3 }, :rss_x]
  ].freeze

  def lines(verdicts)
    return if verdicts.empty?

    puts "Per line, over #{verdicts.size} memkit cells (Ruby, server, shape, mode):"
    LINES.each do |name, met, key|
      misses = verdicts.reject(&met)
      shown = misses.map do |v|
        value = v[key]
        "#{v[:cell]} #{value.is_a?(Array) ? value.join('/') : (value.is_a?(Float) ? format('%.2f', value) : value)}"
      end
      puts format("  %-42s %3d of %d%s", name, verdicts.size - misses.size, verdicts.size,
                  misses.empty? ? "" : "; misses: #{shown.join(', ')}")
    end
  end
end

OobgcMatrix.run(ARGV) if $PROGRAM_NAME == __FILE__
