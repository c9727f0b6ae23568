# frozen_string_literal: true

# Memkit::OobGC on a real Rails app (bench/rails/, Rails 7.1, SQLite, ERB
# pages and a JSON API), under real Unicorn and real Puma (cluster), 2
# workers, 1 thread, default Ruby GC settings:
#
#   none     the app alone
#   memkit   `use Memkit::OobGC` with its defaults
#   heap     the app alone, booted with the RUBY_GC_HEAP_* values memkit chose
#            (OobGC.stats.boot_env of the memkit run's workers, the mean per
#            value): Ruby alone at memkit's heap size, the anchor for "GC runs
#            per request"
#
#   bench/rails/setup                       # once: the app's gems and its SQLite file
#   flock /tmp/memkit-bench.lock bundle exec ruby bench/oobgc_rails.rb \
#       [--servers unicorn,puma] [--duration 20] [--connections 4] [--paced] [--repeat N] [--out rows.jsonl]
#   bundle exec ruby bench/oobgc_rails.rb --report rows.jsonl
#
# --modes memkit,none,heap picks the modes (heap needs a memkit run first, or
# --boot-env K=V,...; --anchor actual: on Ruby 3.1, heap at the slots memkit's
# workers had at exit instead of the INIT_SLOTS memkit advises; --anchor
# workers: besides heap, one "heapw" run per memkit worker at that worker's
# own boot_env, and memkit's GC runs against those: the workers of one run
# can grow different pools (3.4: one worker's 160-byte pool at 124,745
# slots, the other's at 69,121), and the mean per value is a heap neither
# had); --patch FILE has each worker load FILE after memkit (a
# prototype change to OobGC, measured without editing lib/); --label names
# such a run in the tables; --record DIR has each worker write, per request,
# the objects it allocated per size pool to DIR/req-MODE-PID.log (input for
# bench/oobgc_replay.rb). Besides the GC counts, each row keeps why the
# GCs inside requests ran (gc_by/major_by), the workers' RSS sampled every 25
# requests (mean), and at exit the object heap's pages and the RSS by kind
# of mapping: brk (glibc's main arena), anonymous >= 32 MB (3.1's transient
# heap), other anonymous (3.3+'s object pages, large malloc blocks); and the
# server tree's total PSS (master and workers) once the load has stopped.
#
# Each mode boots the server fresh, warms it until every worker has served
# 100 requests (the GC probe in bench/rails/oobgc.ru counts from each
# worker's 101st), then drives it with wrk for --duration seconds through a
# fixed mix of pages (lists, product pages, categories, the JSON API, a third
# in French). Saturated by default (no pause); --paced adds a run at about
# 60% of the saturated throughput of "none" for p99. --repeat N runs it all N
# times in turn, each heap run at the boot_env of the memkit run just before
# it, and prints each run's ratio of GC runs per request and their median:
# single runs of the same code on 3.4 spread from 1.12x to 1.32x.
$LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
require "memkit"
require "memkit/loopback"
require "memkit/cli"
require "memkit/tree"
require "net/http"
require "json"
require "optparse"
require "tmpdir"
require "fileutils"

module OobgcRails
  DIR = File.expand_path("rails", __dir__)
  DB = ENV.fetch("BENCH_RAILS_DB", File.join(Dir.tmpdir, "memkit-bench-rails.sqlite3"))
  # Another Gemfile for the app where its lock does not install as it is
  # (Ruby 3.4: sqlite3 1.7.3 has no x86_64-linux build for 3.4, and the
  # chroot's frozen bundler will not add the source gem to the shared lock).
  GEMFILE = ENV.fetch("BENCH_RAILS_GEMFILE", File.join(DIR, "Gemfile"))
  WORKERS = 2
  SKIP = 100

  module_function

  def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

  # The same page mix in every run: HTML lists, product and category pages,
  # the JSON API; every third request in French. wrk draws each request from
  # it at random (#lua): cycled in order, with two workers taking requests
  # in turn, one worker got more of the pages that fill the 40-byte pool and
  # the other more of those that fill the 160-byte one, and a worker's GC
  # runs per request moved by up to 25% between runs at the same heap.
  def paths(count = 240)
    cats = %w[books music garden tools toys kitchen sports travel office health]
    Array.new(count) do |i|
      base = [-> { "/products?page=#{1 + (i / 4) % 80}" }, -> { "/products/#{1 + (i * 7) % 1_900}" },
              -> { "/categories/#{cats[i % 10]}" }, -> { "/api/products.json?page=#{1 + (i / 4) % 90}" }][i % 4].call
      (i % 3).zero? ? "#{base}#{base.include?('?') ? '&' : '?'}locale=fr" : base
    end
  end

  def lua(dir)
    path = File.join(dir, "paths.lua")
    File.write(path, <<~LUA)
      -- draws each request from the bench's page mix, seeded per thread;
      -- OOBGC_PACE_MS pauses between a response and the next request
      local paths = { #{paths.map(&:inspect).join(', ')} }
      local pace = tonumber(os.getenv("OOBGC_PACE_MS") or "0")
      local counter = 0
      function setup(thread) counter = counter + 1; thread:set("offset", counter * 61) end
      function init(args) math.randomseed(1000 + (offset or 0)) end
      function request()
        return wrk.format("GET", paths[math.random(#paths)])
      end
      if pace > 0 then function delay() return pace end end
    LUA
    path
  end

  def start(server, mode, dir, boot_env, patch = nil, skip: SKIP, record: nil)
    port = Memkit::Loopback.free_port
    log = File.join(dir, "#{server}.log")
    env = { "BUNDLE_GEMFILE" => GEMFILE, "BENCH_RAILS_DB" => DB, "COW_MEMKIT" => "plain",
            "COW_PORT" => port.to_s, "COW_WORKERS" => WORKERS.to_s, "RUBYOPT" => nil, "BUNDLE_BIN_PATH" => nil,
            # Bundler 4 (Ruby 3.4's) names the outer bundle's lock too.
            "BUNDLE_LOCKFILE" => nil, "BUNDLER_SETUP" => nil,
            "OOBGC" => mode == "memkit" ? "1" : nil, "OOBGC_DIR" => dir, "OOBGC_SKIP" => skip.to_s,
            "OOBGC_PATCH" => mode == "memkit" && patch ? File.expand_path(patch) : nil,
            "OOBGC_RECORD" => record && File.expand_path(record), "OOBGC_MODE" => mode }
    env.merge!(boot_env.transform_values(&:to_s)) if mode.start_with?("heap")
    # A rackup file on Puma's command line overrides the one in puma.rb.
    argv = server == "unicorn" ? %w[unicorn -c unicorn.rb oobgc.ru] : %w[puma -C puma.rb oobgc.ru]
    argv = ["bundle", "exec", *argv]
    pid = Process.spawn(env, *argv, chdir: DIR, out: log, err: log, pgroup: true)
    deadline = now + 180
    until get(port, "/products/1")
      raise "#{server} #{mode} did not boot; log #{log}:\n#{File.read(log)[-3000..]}" if now > deadline
      raise "#{server} #{mode} exited; log #{log}:\n#{File.read(log)[-3000..]}" if Process.wait(pid, Process::WNOHANG)

      sleep 0.5
    end
    [pid, port]
  end

  def get(port, path)
    Net::HTTP.start("127.0.0.1", port, open_timeout: 2, read_timeout: 30) { |h| h.get(path).code == "200" }
  rescue SystemCallError, Net::OpenTimeout, Net::ReadTimeout, EOFError, IOError
    false
  end

  # The server's graceful stop, so the workers' at_exit writes the probe's
  # figures.
  def stop(server, pid)
    Process.kill(Memkit::MemoryLimit::SIGNALS.fetch(server.to_sym), pid) rescue nil
    deadline = now + 30
    sleep 0.1 while now < deadline && !Process.wait(pid, Process::WNOHANG)
    # A Puma master can exit before its workers have run their at_exit:
    # they get until the deadline too.
    sleep 0.1 while now < deadline && group_alive?(pid)
    Process.kill(:KILL, -pid) rescue nil
    Process.wait(pid) rescue nil
  end

  def group_alive?(pgid)
    Process.kill(0, -pgid)
    true
  rescue Errno::ESRCH
    false
  end

  def wrk(port, seconds, connections, pace, script)
    cmd = ["wrk", "-t2", "-c#{connections}", "-d#{seconds}s", "--latency", "--timeout", "20s", "-s", script,
           "http://127.0.0.1:#{port}/"]
    out = IO.popen({ "OOBGC_PACE_MS" => pace.to_s }, cmd, err: %i[child out], &:read)
    raise "wrk failed:\n#{out}" unless $?.success?

    latency = out.scan(/^\s+(50|99)%\s+([\d.]+)(us|ms|s)\b/).to_h do |pct, value, unit|
      [pct.to_i, value.to_f * { "us" => 0.001, "ms" => 1.0, "s" => 1000.0 }.fetch(unit)]
    end
    non2xx = out[/Non-2xx or 3xx responses: (\d+)/, 1].to_i
    { rps: out[/Requests\/sec:\s+([\d.]+)/, 1].to_f, p50: latency[50], p99: latency[99], non2xx: non2xx }
  end

  # The workers' boot_env, each value the mean of the workers that give it:
  # the anchor at the heap memkit chose on average. At the largest worker's,
  # it ran with more memory than memkit's workers (3.3 Puma: RSS 103.0 MB
  # where memkit's was 99.2 MB, one worker's main pool 8 pages smaller).
  def mean_env(envs)
    envs.flat_map(&:keys).uniq.to_h do |key|
      values = envs.filter_map { |e| e[key] }
      [key, values.sum.fdiv(values.size).round]
    end
  end

  # One boot: warm-up (each worker past SKIP requests; the probe starts
  # counting there), then the measured wrk run.
  def cell(server, mode, load, opts, boot_env: {}, pace: 0)
    Dir.mktmpdir("memkit-oobgc-rails") do |dir|
      script = lua(dir)
      pid, port = start(server, mode, dir, boot_env, opts[:patch], skip: opts[:skip], record: opts[:record])
      begin
        # Rails requests take 5-30 ms: this many seconds of saturated load
        # gives each worker well over SKIP requests.
        wrk(port, opts[:warmup], opts[:connections], 0, script)
        result = wrk(port, opts[:duration], opts[:connections], pace, script)
        # What the user pays: the whole tree (master and workers), at rest
        # after the load.
        result[:tree_pss] = Memkit::Tree.read(pid).total_pss
        # The workers write their figures now (bench/rails/oobgc.ru).
        Process.kill(:PWR, -pid)
        deadline = now + 10
        sleep 0.1 while Dir[File.join(dir, "gc-*.json")].size < WORKERS && now < deadline
      ensure
        stop(server, pid)
      end
      sleep 0.1
      probes = Dir[File.join(dir, "gc-*.json")].map { |f| JSON.parse(File.read(f)) }
      warn "#{server} #{mode}: #{probes.size} of #{WORKERS} workers reported" if probes.size < WORKERS
      sum = ->(key) { probes.sum { |p| p[key].to_i } }
      oob = probes.map { |p| p["oob"] }.compact
      mean = ->(list) { (l = list.compact).empty? ? nil : l.sum.fdiv(l.size) }
      memory = probes.map { |p| p["memory"]&.transform_keys(&:to_sym) }.compact
      result.merge(
        server: server, mode: mode, load: load, ruby: RUBY_VERSION, workers: probes.size,
        requests: sum.("requests"), allocated: sum.("allocated"), gc_total: sum.("gc_total"),
        allocated_pools: probes.map { |p| p["allocated_pools"] }.compact.transpose.map(&:sum).then { |a| a.empty? ? nil : a },
        gc_major: sum.("gc_major"),
        gc_inside: sum.("gc_inside"), gc_inside_major: sum.("gc_inside_major"),
        rss_kb: sum.("rss_kb").fdiv([probes.size, 1].max), heap_slots: sum.("heap_slots").fdiv([probes.size, 1].max),
        boot_env: mean_env(oob.map { |o| o["boot_env"] }.reject { |e| e.nil? || e.empty? }),
        gave_up: oob.map { |o| o["gave_up"] }.compact.first, heap_grown: oob.sum { |o| o["heap_grown_bytes"].to_i },
        boot_env_used: mode.start_with?("heap") ? boot_env : nil, label: opts[:label],
        inside_by: probes.map { |p| p["inside_by"] || {} }.reduce({}) { |a, b| a.merge(b) { |_, x, y| x + y } },
        oob_window: probes.map { |p| p["oob_window"] }.compact.reduce(nil) do |a, b|
          a ? a.merge(b) { |_, x, y| x + y } : b
        end,
        rss_mean_kb: mean.(probes.map { |p| p["rss_mean_kb"] }), rss_max_kb: mean.(probes.map { |p| p["rss_max_kb"] }),
        memory: memory.empty? ? nil : (memory.first.keys - [:pools]).to_h { |k| [k, mean.(memory.map { |m| m[k] })&.round] },
        pools: memory.map { |m| m[:pools] }.compact,
        profile: oob.map { |o| o["profile"] }.compact.first,
        per_worker: probes.map do |p|
          { requests: p["requests"].to_i, gc_total: p["gc_total"].to_i, boot_env: p.dig("oob", "boot_env") }
        end
      )
    end
  end

  def main(argv)
    opts = { servers: %w[unicorn puma], duration: 20, warmup: 8, connections: 4, paced: false, out: nil,
             modes: %w[memkit none heap], patch: nil, skip: SKIP, label: nil, boot_env: nil, repeat: 1 }
    OptionParser.new do |o|
      o.on("--servers LIST", Array) { |v| opts[:servers] = v }
      o.on("--duration S", Integer) { |v| opts[:duration] = v }
      o.on("--warmup S", Integer) { |v| opts[:warmup] = v }
      o.on("--skip N", Integer, "count from each worker's request N+1 (default #{SKIP}; --warmup must reach it)") do |v|
        opts[:skip] = v
      end
      o.on("--connections N", Integer) { |v| opts[:connections] = v }
      o.on("--paced", "also a run at ~60% of none's throughput, for p99") { opts[:paced] = true }
      o.on("--out FILE", "append each cell as a JSON line") { |v| opts[:out] = v }
      o.on("--modes LIST", Array, "memkit,none,heap (default all three)") { |v| opts[:modes] = v }
      o.on("--patch FILE", "memkit mode's workers load FILE after memkit") { |v| opts[:patch] = v }
      o.on("--label NAME", "names this run's rows in the tables") { |v| opts[:label] = v }
      o.on("--record DIR", "each worker writes its requests' objects per pool to DIR") do |v|
        FileUtils.mkdir_p(v)
        opts[:record] = v
      end
      o.on("--repeat N", Integer, "run it all N times in turn; the median GC/req ratio") { |v| opts[:repeat] = v }
      o.on("--anchor KIND", "heap mode at memkit's advised boot_env (advised) or its heap at exit (actual); " \
                            "workers: also one heapw run per memkit worker, at that worker's boot_env") do |v|
        opts[:anchor] = v
      end
      o.on("--boot-env LIST", Array, "heap mode's RUBY_GC_* values, K=V,...") do |v|
        opts[:boot_env] = v.to_h { |kv| kv.split("=", 2) }
      end
      o.on("--report FILES", Array, "print the tables of earlier runs, run nothing") { |v| opts[:report] = v }
    end.parse!(argv)
    if opts[:report]
      return report(opts[:report].flat_map { |f| File.readlines(f).map { |l| JSON.parse(l, symbolize_names: true) } })
    end
    raise "#{DB} missing: run bench/rails/setup first" unless File.exist?(DB)

    puts "oobgc_rails: #{RUBY_DESCRIPTION}; #{WORKERS} workers, 1 thread; wrk -c#{opts[:connections]} " \
         "-d#{opts[:duration]}s after #{opts[:warmup]}s of warm-up; " \
         "counted from each worker's request #{opts[:skip] + 1}; " \
         "#{Time.now.utc.strftime('%F %T')} UTC"
    rows = []
    run = 0
    record = lambda do |row|
      row[:run] = run
      rows << row
      File.open(opts[:out], "a") { |f| f.puts(JSON.generate(row)) } if opts[:out]
      $stderr.puts format("%s %s %s %s: %.1f req/s p99 %.1f ms; %d requests, gc %d (major %d), " \
                          "inside %d (major %d) by %s; rss mean %.1f MB%s",
                          Time.now.utc.strftime("%T"), row[:server], row[:mode], row[:load], row[:rps], row[:p99].to_f,
                          row[:requests], row[:gc_total], row[:gc_major], row[:gc_inside], row[:gc_inside_major],
                          row[:inside_by], row[:rss_mean_kb].to_f / 1024,
                          row[:mode] == "memkit" ? " boot_env #{row[:boot_env]} window #{row[:oob_window]}" : "")
      row
    end
    (0...opts[:repeat]).to_a.product(opts[:servers]).each do |k, server|
      run = k
      modes = opts[:modes]
      mk = record.call(cell(server, "memkit", "saturated", opts)) if modes.include?("memkit")
      none = record.call(cell(server, "none", "saturated", opts)) if modes.include?("none")
      boot_env = opts[:boot_env] || mk&.fetch(:boot_env)
      # Ruby 3.1 (one heap): Ruby alone at the heap memkit's workers ended
      # with, rather than at the INIT_SLOTS memkit advises.
      if opts[:anchor] == "actual" && mk && boot_env.keys == ["RUBY_GC_HEAP_INIT_SLOTS"]
        boot_env = { "RUBY_GC_HEAP_INIT_SLOTS" => mk[:heap_slots].round }
      end
      record.call(cell(server, "heap", "saturated", opts, boot_env: boot_env)) if modes.include?("heap") && boot_env
      if opts[:anchor] == "workers" && mk && modes.include?("heap")
        mk[:per_worker].each_with_index do |w, k|
          next if w[:boot_env].nil? || w[:boot_env].empty?

          record.call(cell(server, "heapw", "saturated", opts, boot_env: w[:boot_env]).merge(worker: k))
        end
      end
      next unless opts[:paced] && mk && none

      pace = [(1000.0 * opts[:connections] / (none[:rps] * 0.6) - none[:p50].to_f).round, 1].max
      %w[none memkit heap].each do |mode|
        record.call(cell(server, mode, "paced", opts, boot_env: mk[:boot_env], pace: pace))
      end
    end
    report(rows)
  end

  def report(rows)
    rows = rows.map { |r| r.transform_keys(&:to_sym) }
    rows.each { |r| r[:mode] = "#{r[:mode]}:#{r[:label]}" if r[:label] && !r[:mode].include?(":") }
    header = %w[ruby server mode load req/s p50_ms p99_ms requests gc_runs majors inside inside_major outside%
                gc/req rss_MB rss_mean_MB tree_pss_MB heap_pages_MB brk_MB anon32_MB anon_MB heap_slots]
    table = rows.map do |r|
      m = r[:memory] || {}
      [r[:ruby], r[:server], r[:mode], r[:load], format("%.1f", r[:rps]), format("%.1f", r[:p50].to_f),
       format("%.1f", r[:p99].to_f), r[:requests], r[:gc_total], r[:gc_major], r[:gc_inside], r[:gc_inside_major],
       outside(r), format("%.4f", per_request(r)), mb(r[:rss_kb]), mb(r[:rss_mean_kb]),
       r[:tree_pss] ? format("%.1f", r[:tree_pss] / 1048576.0) : "-", mb(m[:heap_pages_kb]),
       mb(m[:brk_kb]), mb(m[:anon_big_kb]), mb(m[:anon_kb]), r[:heap_slots].round]
    end
    puts Memkit::CLI.table(header, table, left: [0, 1, 2, 3])
    puts
    rows.each do |r|
      next if r[:inside_by].nil? || r[:inside_by].empty?

      puts format("  %s %s %s %s: GCs inside requests by gc_by/major_by %s", r[:ruby], r[:server], r[:mode], r[:load],
                  r[:inside_by].map { |k, v| "#{k} #{v}" }.join(", "))
    end
    puts
    rows.group_by { |r| [r[:ruby], r[:server], r[:load]] }.each do |(ruby, server, load), list|
      by = list.group_by { |r| r[:mode] }.transform_values(&:last)
      by.each do |mode, mk|
        next unless mode.start_with?("memkit")

        label = mode.split(":", 2)[1]

        line = format("Ruby %s %-7s %-9s %s: %s%% of GC runs out of requests, %d majors inside", ruby, server, load,
                      mode, outside(mk), mk[:gc_inside_major])
        if (heap = by["heap:#{label}"] || by["heap"])
          line << format("; GC/req %.2fx %s (Ruby alone at %s)", per_request(mk) / per_request(heap), heap[:mode],
                         heap[:boot_env_used]&.map { |k, v| "#{k}=#{v}" }&.join(" ") || "memkit's heap size")
          line << format(", p99 %.2fx heap", mk[:p99].to_f / heap[:p99].to_f)
        end
        anchors = list.select { |r| mode?(r, "heapw") && r[:run] == mk[:run] }
        if (ratio = per_worker_ratio(mk, anchors))
          line << format("; GC/req %.2fx Ruby alone at each worker's own heap", ratio)
        end
        if (none = by["none:#{label}"] || by["none"])
          line << format(", GC/req %.2fx none; req/s %.2fx none, p99 %.2fx none, RSS %.2fx none (mean %.2fx)",
                         per_request(mk) / per_request(none), mk[:rps] / none[:rps], mk[:p99].to_f / none[:p99].to_f,
                         mk[:rss_kb] / none[:rss_kb], mk[:rss_mean_kb].to_f / [none[:rss_mean_kb].to_f, 1].max)
          if mk[:tree_pss] && none[:tree_pss]
            line << format(", tree PSS %.2fx none", mk[:tree_pss].fdiv(none[:tree_pss]))
            line << format(" (%.2fx heap)", mk[:tree_pss].fdiv(heap[:tree_pss])) if heap&.dig(:tree_pss)
          end
        end
        puts line
        puts "  #{mode}'s boot_env: #{mk[:boot_env]}; gave_up: #{mk[:gave_up] || '-'}; " \
             "in the window: #{mk[:oob_window] || '-'}; profile: #{mk[:profile] || '-'}"
      end
    end
    report_runs(rows)
  end

  # Where the rows hold several runs (--repeat): each run's memkit GC runs
  # per request over its heap run's, and their median.
  def report_runs(rows)
    rows.select { |r| r[:run] }.group_by { |r| [r[:ruby], r[:server], r[:load], r[:label]] }.each do |key, list|
      ratios = list.group_by { |r| r[:run] }.values.filter_map do |run|
        mk = run.find { |r| r[:mode].start_with?("memkit") }
        heap = run.find { |r| mode?(r, "heap") }
        per_request(mk) / per_request(heap) if mk && heap && per_request(heap).positive?
      end
      own = list.group_by { |r| r[:run] }.values.filter_map do |run|
        mk = run.find { |r| r[:mode].start_with?("memkit") } or next
        anchors = run.select { |r| mode?(r, "heapw") }
        print_workers(mk, anchors)
        per_worker_ratio(mk, anchors)
      end
      print_runs(key, ratios, "heap")
      print_runs(key, own, "each worker's own heap")
    end
  end

  def print_runs(key, ratios, anchor)
    return if ratios.size < 2

    ruby, server, load, label = key
    sorted = ratios.sort
    median = (sorted[(sorted.size - 1) / 2] + sorted[sorted.size / 2]) / 2 # the middle pair's mean when even
    puts format("Ruby %s %-7s %-9s %s: GC/req vs %s by run %s; median %.2fx", ruby, server, load,
                label ? "memkit:#{label}" : "memkit", anchor, ratios.map { |x| format("%.2fx", x) }.join(", "), median)
  end

  # Each memkit worker's GC runs per request against Ruby alone's at its
  # boot_env (--anchor workers).
  def print_workers(mk, anchors)
    anchors.each do |anchor|
      w = mk[:per_worker].fetch(anchor[:worker])
      mine = w[:gc_total].fdiv([w[:requests], 1].max)
      puts format("  run %d %s worker %d: memkit %.4f GC/req, Ruby alone at its heap %.4f (%.2fx); %s", mk[:run],
                  mk[:server], anchor[:worker], mine, per_request(anchor), mine / per_request(anchor),
                  w[:boot_env].values.join("/"))
    end
  end

  # memkit's GC runs over those Ruby alone runs at each worker's own heap
  # (--anchor workers): worker k's requests at the GC runs per request of
  # the heapw run booted with worker k's boot_env. nil without such runs.
  def per_worker_ratio(mk, anchors)
    pairs = (mk[:per_worker] || []).each_with_index.filter_map do |w, k|
      anchor = anchors.find { |r| r[:worker] == k } or next
      [w, per_request(anchor)]
    end
    expected = pairs.sum { |w, rate| w[:requests] * rate }
    pairs.sum { |w, _| w[:gc_total] } / expected if expected.positive?
  end

  # Whether row `r` is of `mode`, with or without a --label.
  def mode?(r, mode) = r[:mode].split(":").first == mode

  def mb(kb) = kb ? format("%.1f", kb / 1024.0) : "-"

  def outside(r) = r[:gc_total].zero? ? "-" : format("%.1f", 100.0 * (r[:gc_total] - r[:gc_inside]) / r[:gc_total])

  def per_request(r) = r[:gc_total].fdiv([r[:requests], 1].max)
end

OobgcRails.main(ARGV) if $PROGRAM_NAME == __FILE__
