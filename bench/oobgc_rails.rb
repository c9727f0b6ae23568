# frozen_string_literal: true

# Memkit::OobGC on a real Rails app (bench/rails/, Rails 7.1, SQLite, ERB
# pages and a JSON API), under real Unicorn and real Puma (cluster), 2
# workers, 1 thread, default Ruby GC settings:
#
#   none     the app alone
#   memkit   `use Memkit::OobGC` with its defaults
#   heap     the app alone, booted with the RUBY_GC_HEAP_* values memkit chose
#            (OobGC.stats.boot_env of the memkit run's workers): Ruby alone at
#            memkit's heap size, the anchor for "GC runs per request"
#
#   bench/rails/setup                       # once: the app's gems and its SQLite file
#   flock /tmp/memkit-bench.lock bundle exec ruby bench/oobgc_rails.rb \
#       [--servers unicorn,puma] [--duration 20] [--connections 4] [--paced] [--out rows.jsonl]
#   bundle exec ruby bench/oobgc_rails.rb --report rows.jsonl
#
# Each mode boots the server fresh, warms it until every worker has served
# 100 requests (the GC probe in bench/rails/oobgc.ru counts from each
# worker's 101st), then drives it with wrk for --duration seconds through a
# fixed mix of pages (lists, product pages, categories, the JSON API, a third
# in French). Saturated by default (no pause); --paced adds a run at about
# 60% of the saturated throughput of "none" for p99.
$LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
require "memkit"
require "memkit/loopback"
require "memkit/cli"
require "net/http"
require "json"
require "optparse"
require "tmpdir"
require "fileutils"

module OobgcRails
  DIR = File.expand_path("rails", __dir__)
  DB = ENV.fetch("BENCH_RAILS_DB", File.join(Dir.tmpdir, "memkit-bench-rails.sqlite3"))
  WORKERS = 2
  SKIP = 100

  module_function

  def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

  # The same page mix in every run: HTML lists, product and category pages,
  # the JSON API; every third request in French.
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
      -- cycles each connection through the bench's page mix; OOBGC_PACE_MS
      -- pauses between a response and the next request
      local paths = { #{paths.map(&:inspect).join(', ')} }
      local pace = tonumber(os.getenv("OOBGC_PACE_MS") or "0")
      local counter = 0
      function setup(thread) counter = counter + 1; thread:set("offset", counter * 61) end
      local i = 0
      function request()
        i = i + 1
        return wrk.format("GET", paths[((i + (offset or 0)) % #paths) + 1])
      end
      if pace > 0 then function delay() return pace end end
    LUA
    path
  end

  def start(server, mode, dir, boot_env)
    port = Memkit::Loopback.free_port
    log = File.join(dir, "#{server}.log")
    env = { "BUNDLE_GEMFILE" => File.join(DIR, "Gemfile"), "BENCH_RAILS_DB" => DB, "COW_MEMKIT" => "plain",
            "COW_PORT" => port.to_s, "COW_WORKERS" => WORKERS.to_s, "RUBYOPT" => nil, "BUNDLE_BIN_PATH" => nil,
            "OOBGC" => mode == "memkit" ? "1" : nil, "OOBGC_DIR" => dir, "OOBGC_SKIP" => SKIP.to_s }
    env.merge!(boot_env.transform_values(&:to_s)) if mode == "heap"
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

  # Graceful for both (Unicorn: QUIT; Puma: TERM), so the workers' at_exit
  # writes the probe's figures.
  def stop(server, pid)
    Process.kill(server == "unicorn" ? :QUIT : :TERM, pid) rescue nil
    deadline = now + 30
    sleep 0.1 while now < deadline && !Process.wait(pid, Process::WNOHANG)
    Process.kill(:KILL, -pid) rescue nil
    Process.wait(pid) rescue nil
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

  # One boot: warm-up (each worker past SKIP requests; the probe starts
  # counting there), then the measured wrk run.
  def cell(server, mode, load, opts, boot_env: {}, pace: 0)
    Dir.mktmpdir("memkit-oobgc-rails") do |dir|
      script = lua(dir)
      pid, port = start(server, mode, dir, boot_env)
      begin
        # Rails requests take 5-30 ms: this many seconds of saturated load
        # gives each worker well over SKIP requests.
        wrk(port, opts[:warmup], opts[:connections], 0, script)
        result = wrk(port, opts[:duration], opts[:connections], pace, script)
      ensure
        stop(server, pid)
      end
      # A Puma master can exit before its workers have run their at_exit.
      deadline = now + 10
      sleep 0.1 while Dir[File.join(dir, "gc-*.json")].size < WORKERS && now < deadline
      sleep 0.1
      probes = Dir[File.join(dir, "gc-*.json")].map { |f| JSON.parse(File.read(f)) }
      warn "#{server} #{mode}: #{probes.size} of #{WORKERS} workers reported" if probes.size < WORKERS
      sum = ->(key) { probes.sum { |p| p[key].to_i } }
      oob = probes.map { |p| p["oob"] }.compact
      result.merge(
        server: server, mode: mode, load: load, ruby: RUBY_VERSION, workers: probes.size,
        requests: sum.("requests"), gc_total: sum.("gc_total"), gc_major: sum.("gc_major"),
        gc_inside: sum.("gc_inside"), gc_inside_major: sum.("gc_inside_major"),
        rss_kb: sum.("rss_kb").fdiv([probes.size, 1].max), heap_slots: sum.("heap_slots").fdiv([probes.size, 1].max),
        boot_env: oob.map { |o| o["boot_env"] }.reject { |e| e.nil? || e.empty? }.max_by { |e| e.values.sum } || {},
        gave_up: oob.map { |o| o["gave_up"] }.compact.first, heap_grown: oob.sum { |o| o["heap_grown_bytes"].to_i },
        boot_env_used: mode == "heap" ? boot_env : nil
      )
    end
  end

  def main(argv)
    opts = { servers: %w[unicorn puma], duration: 20, warmup: 8, connections: 4, paced: false, out: nil }
    OptionParser.new do |o|
      o.on("--servers LIST", Array) { |v| opts[:servers] = v }
      o.on("--duration S", Integer) { |v| opts[:duration] = v }
      o.on("--warmup S", Integer) { |v| opts[:warmup] = v }
      o.on("--connections N", Integer) { |v| opts[:connections] = v }
      o.on("--paced", "also a run at ~60% of none's throughput, for p99") { opts[:paced] = true }
      o.on("--out FILE", "append each cell as a JSON line") { |v| opts[:out] = v }
      o.on("--report FILES", Array, "print the tables of earlier runs, run nothing") { |v| opts[:report] = v }
    end.parse!(argv)
    if opts[:report]
      return report(opts[:report].flat_map { |f| File.readlines(f).map { |l| JSON.parse(l, symbolize_names: true) } })
    end
    raise "#{DB} missing: run bench/rails/setup first" unless File.exist?(DB)

    puts "oobgc_rails: #{RUBY_DESCRIPTION}; #{WORKERS} workers, 1 thread; wrk -c#{opts[:connections]} " \
         "-d#{opts[:duration]}s after #{opts[:warmup]}s of warm-up; " \
         "counted from each worker's #{SKIP + 1}st request; " \
         "#{Time.now.utc.strftime('%F %T')} UTC"
    rows = []
    record = lambda do |row|
      rows << row
      File.open(opts[:out], "a") { |f| f.puts(JSON.generate(row)) } if opts[:out]
      $stderr.puts format("%s %s %s %s: %.1f req/s p99 %.1f ms; %d requests, gc %d (major %d), " \
                          "inside %d (major %d)%s",
                          Time.now.utc.strftime("%T"), row[:server], row[:mode], row[:load], row[:rps], row[:p99].to_f,
                          row[:requests], row[:gc_total], row[:gc_major], row[:gc_inside], row[:gc_inside_major],
                          row[:mode] == "memkit" ? " boot_env #{row[:boot_env]}" : "")
      row
    end
    opts[:servers].each do |server|
      mk = record.call(cell(server, "memkit", "saturated", opts))
      none = record.call(cell(server, "none", "saturated", opts))
      record.call(cell(server, "heap", "saturated", opts, boot_env: mk[:boot_env]))
      next unless opts[:paced]

      pace = [(1000.0 * opts[:connections] / (none[:rps] * 0.6) - none[:p50].to_f).round, 1].max
      %w[none memkit heap].each do |mode|
        record.call(cell(server, mode, "paced", opts, boot_env: mk[:boot_env], pace: pace))
      end
    end
    report(rows)
  end

  def report(rows)
    rows = rows.map { |r| r.transform_keys(&:to_sym) }
    header = %w[ruby server mode load req/s p50_ms p99_ms requests gc_runs majors inside inside_major outside%
                gc/req rss_MB/worker heap_slots/worker]
    table = rows.map do |r|
      [r[:ruby], r[:server], r[:mode], r[:load], format("%.1f", r[:rps]), format("%.1f", r[:p50].to_f),
       format("%.1f", r[:p99].to_f), r[:requests], r[:gc_total], r[:gc_major], r[:gc_inside], r[:gc_inside_major],
       outside(r), format("%.3f", per_request(r)), format("%.1f", r[:rss_kb] / 1024.0), r[:heap_slots].round]
    end
    puts Memkit::CLI.table(header, table, left: [0, 1, 2, 3])
    puts
    rows.group_by { |r| [r[:ruby], r[:server], r[:load]] }.each do |(ruby, server, load), list|
      by = list.to_h { |r| [r[:mode], r] }
      next unless by["memkit"]

      mk = by["memkit"]
      line = format("Ruby %s %-7s %-9s memkit: %s%% of GC runs out of requests", ruby, server, load, outside(mk))
      if (heap = by["heap"])
        line << format("; GC/req %.2fx heap (Ruby alone at memkit's heap size)", per_request(mk) / per_request(heap))
        line << format(", p99 %.2fx heap", mk[:p99].to_f / heap[:p99].to_f)
      end
      if (none = by["none"])
        line << format(", GC/req %.2fx none; req/s %.2fx none, p99 %.2fx none, RSS %.2fx none",
                       per_request(mk) / per_request(none), mk[:rps] / none[:rps], mk[:p99].to_f / none[:p99].to_f,
                       mk[:rss_kb] / none[:rss_kb])
      end
      puts line
      puts "  memkit's boot_env: #{mk[:boot_env]}; gave_up: #{mk[:gave_up] || '-'}"
    end
  end

  def outside(r) = r[:gc_total].zero? ? "-" : format("%.1f", 100.0 * (r[:gc_total] - r[:gc_inside]) / r[:gc_total])

  def per_request(r) = r[:gc_total].fdiv([r[:requests], 1].max)
end

OobgcRails.main(ARGV) if $PROGRAM_NAME == __FILE__
