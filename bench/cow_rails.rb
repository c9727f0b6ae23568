# frozen_string_literal: true

# Copy-on-write on a real Rails app (bench/rails/): boots it under real
# Unicorn and real Puma (cluster), 4 workers, preloaded in the master, once per
# way of preparing the master; at each request count sends every worker the
# same mix of requests (HTML pages with partials and helpers in two locales,
# the JSON API), has every worker run a full GC, and reads the tree.
#
#   bench/rails/setup                       # once: bundle install + seed the SQLite file
#   flock /tmp/memkit-bench.lock bundle exec ruby bench/cow_rails.rb \
#       [--servers unicorn,puma] [--modes plain,nakayoshi,memkit] [--counts 500,2000] [--repeat 1] [--out rows.jsonl]
#   bundle exec ruby bench/cow_rails.rb --lock /tmp/memkit-bench.lock --counts 2000,10000 ...
#       # one boot per mode, read at each count; the lock is held at most --hold seconds at a time
#   bundle exec ruby bench/cow_rails.rb --report rows.jsonl   # the table and ratios of earlier runs
#
# --out appends one JSON line per measurement, so that a long matrix can run
# as several short runs (each holding the lock under 10 minutes) and be
# reported together.
#
# Modes (bench/rails/modes.rb): plain, nakayoshi (3.1/3.2 anchor), process_warmup
# (3.3+ anchor), memkit (app warm-up requests + heap steps), heap (heap steps only),
# fork (require "memkit/fork"); "+fill"/"+nofill" after a memkit mode; on Puma,
# "+refork" (fork_worker, memkit's refork policy) or "+count" (fork_worker 1000).
#
# The headline is the tree's total PSS (master + workers) and each worker's
# USS; shared% (of the master) is secondary, with the master's size beside it.
$LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
require "memkit"
require "memkit/cow"
require "memkit/loopback"
require "memkit/cli"
require "net/http"
require "json"
require "optparse"
require "rbconfig"
require "tmpdir"

module CowRails
  DIR = File.expand_path("rails", __dir__)
  DB = ENV.fetch("BENCH_RAILS_DB", File.join(Dir.tmpdir, "memkit-bench-rails.sqlite3"))
  ANCHORS = %w[nakayoshi process_warmup].freeze

  Server = Struct.new(:name, :mode, :pid, :port, :log, :counts, keyword_init: true)

  WORKERS = 4

  module_function

  def env_for(mode, port)
    { "BUNDLE_GEMFILE" => File.join(DIR, "Gemfile"), "BENCH_RAILS_DB" => DB, "COW_MEMKIT" => mode,
      "COW_PORT" => port.to_s, "COW_WORKERS" => WORKERS.to_s, "RUBYOPT" => nil, "BUNDLE_BIN_PATH" => nil }
  end

  # The server's workers: every process below the master (with Puma's
  # fork_worker, workers 1..3 are worker 0's children).
  def workers_of(server_pid)
    children = Memkit::ProcFS.children
    found = []
    queue = [server_pid]
    while (pid = queue.shift)
      kids = children.fetch(pid, [])
      found.concat(kids)
      queue.concat(kids)
    end
    found.sort
  end

  def start(name, mode, timeout: 180)
    port = Memkit::Loopback.free_port
    log = File.join(Dir.tmpdir, "memkit-cow-rails-#{name}-#{port}.log")
    argv = name == "unicorn" ? %w[bundle exec unicorn -c unicorn.rb config.ru] : %w[bundle exec puma -C puma.rb]
    pid = Process.spawn(env_for(mode, port), *argv, chdir: DIR, out: log, err: log, pgroup: true)
    server = Server.new(name: name, mode: mode, pid: pid, port: port, log: log, counts: Hash.new(0))
    deadline = now + timeout
    until workers_of(pid).size == WORKERS && get(port, "/gc")
      if now > deadline || !alive?(pid)
        raise "#{name} (#{mode}) did not boot in #{timeout}s; log #{log}:\n#{File.read(log)[-3000..]}"
      end

      sleep 0.3
    end
    server
  end

  def stop(server)
    return unless server

    # The server's graceful stop (with QUIT, Puma's master stayed up until
    # the 20 s below ran out).
    Process.kill(Memkit::MemoryLimit::SIGNALS.fetch(server.name.to_sym), server.pid) rescue nil
    deadline = now + 20
    sleep 0.1 while now < deadline && !Process.wait(server.pid, Process::WNOHANG)
    Process.kill(:KILL, -server.pid) rescue nil
    Process.wait(server.pid) rescue nil
  end

  def alive?(pid)
    Process.kill(0, pid) && true
  rescue Errno::ESRCH
    false
  end

  # [worker pid, worker count] from one request, or nil.
  def get(port, path, limit: nil)
    Net::HTTP.start("127.0.0.1", port, open_timeout: 5, read_timeout: 60) do |http|
      headers = { "Connection" => "close" }
      headers["X-Limit"] = limit.to_s if limit
      response = http.get(path, headers)
      raise "#{path}: #{response.code}" if response.code.to_i >= 500

      response["x-worker"]&.split&.map(&:to_i)
    end
  rescue SystemCallError, Net::OpenTimeout, Net::ReadTimeout, EOFError, IOError
    nil
  end

  # The request mix: list pages, product pages, categories, the JSON API,
  # a third of them in French. The same sequence in every run.
  def path(i)
    locale = (i % 3).zero? ? "locale=fr" : nil
    base = case i % 4
           when 0 then "/products?page=#{1 + (i / 4) % 80}"
           when 1 then "/products/#{1 + (i * 7) % 1_900}"
           when 2 then "/categories/#{%w[books music garden tools toys kitchen sports travel office health][i % 10]}"
           else "/api/products.json?page=#{1 + (i / 4) % 90}"
           end
    locale ? "#{base}#{base.include?('?') ? '&' : '?'}#{locale}" : base
  end

  # Sends requests until the workers' apps have served `per_worker` times
  # the number of workers in all since boot; a worker that served
  # `per_worker` itself answers without the app (X-Limit), so the others
  # catch up. Without reforks that is exactly `per_worker` each; with them,
  # the requests of the workers a refork replaced count too.
  def drive(server, per_worker, clients: 4, timeout: 900)
    counts = server.counts
    lock = Mutex.new
    seq = counts.values.sum
    deadline = now + timeout
    done = -> { lock.synchronize { counts.values.sum >= per_worker * WORKERS } }
    Array.new(clients) do
      Thread.new do
        until done.call || now > deadline
          i = lock.synchronize { seq += 1 }
          pid, count = get(server.port, path(i), limit: per_worker)
          lock.synchronize { counts[pid] = [counts[pid], count].max } if pid
        end
      end
    end.each(&:join)
    raise "workers did not reach #{per_worker} requests in #{timeout}s: #{counts}" unless done.call

    counts
  end

  # A full GC in every worker: /gc holds its worker for `hold` seconds, so
  # concurrent calls reach distinct workers, and MallocRelease's thread (a
  # look a second) has trimmed after it. Returns the pids that ran it.
  def gc_all(server, hold: 1.5, timeout: 120)
    seen = {}
    deadline = now + timeout
    loop do
      want = workers_of(server.pid)
      seen.select! { |pid, _| want.include?(pid) } # a refork replaced it
      return seen.keys.sort if want.size == WORKERS && (want - seen.keys).empty?
      raise "not every worker ran /gc in #{timeout}s" if now > deadline

      Array.new(WORKERS) { Thread.new { get(server.port, "/gc?hold=#{hold}") } }.each do |t|
        pid, = t.value
        seen[pid] = true if pid
      end
    end
  end

  # A refork that starts during the GC round would leave a worker that did
  # not collect in the tree: read again until the tree is exactly the
  # workers that ran the GC.
  def measure(server)
    loop do
      collected = gc_all(server)
      tree = Memkit::Tree.read(server.pid)
      next unless tree.nodes.drop(1).map(&:pid).sort == collected

      master = tree.nodes.first
      workers = tree.nodes.drop(1)
      cow = Memkit::Cow.read(server.pid, workers.map(&:pid))
      log = File.read(server.log)
      return { tree: tree.total_pss, master_pss: master.memory.pss, master_rss: master.memory.rss,
               uss: workers.map { |n| n.memory.uss }, shared: cow.workers.map(&:shared_pct),
               reforks: log.scan("Starting worker refork").size }
    end
  end

  # Holds an flock on `path` while the server is driven or read, for at
  # most `hold` seconds at a time (so that no one hold passes the shared
  # machine's 10 minutes): between steps it lets go, and waits for the lock
  # again, while the server sits idle. nil path: no locking.
  class Lock
    def initialize(path, hold)
      @file = path && File.open(path, File::RDWR | File::CREAT, 0o644)
      @hold = hold
      @since = nil
    end

    def acquire
      return if @file.nil? || @since

      @file.flock(File::LOCK_EX)
      @since = CowRails.now
    end

    def release
      return unless @file && @since

      @file.flock(File::LOCK_UN)
      @since = nil
    end

    # Lets go if held `hold` seconds already, then takes it again.
    def breathe
      return unless @since && CowRails.now - @since > @hold

      release
      sleep 1
      acquire
    end
  end

  # For the in-process labs (bench/cow_rails_lab.rb, cow_rails_pages.rb):
  # loads the app in this process and prepares it for fork as MODE says
  # (plain | nakayoshi | process_warmup | heap | memkit, "+fill" for
  # fill: true). warm: the memkit mode's warm-up requests instead of the
  # app's list. Returns the Rack app and the mode's flags.
  def in_process(mode, warm: nil)
    ENV["BENCH_RAILS_DB"] ||= DB
    Dir.chdir(DIR)
    require "rack"
    app, = Rack::Builder.parse_file(File.join(DIR, "config.ru"))
    name, *flags = mode.split("+")
    options = flags.include?("fill") ? { fill: true } : {}
    Memkit::Railtie.disconnect_database
    case name
    when "plain" then nil
    when "nakayoshi" then require "nakayoshi_fork"
    when "process_warmup" then Process.warmup
    when "heap" then Memkit.warmup(**options)
    when "memkit" then Memkit::Railtie.before_fork(**(warm ? { requests: warm } : {}), **options)
    else abort "unknown mode #{mode}"
    end
    Memkit::Railtie.disconnect_database
    [app, flags]
  end

  # For the in-process labs: forks WORKERS children that each send
  # `requests` of the mix through `app` (child k every WORKERS-th path, from
  # k), calling `before` first, then run `gc` ("full", "minor" or "none") and
  # wait. Yields their pids once all have, then kills them.
  def in_process_children(app, requests, gc: "full", before: nil)
    ready_r, ready_w = IO.pipe
    pids = Array.new(WORKERS) do |k|
      fork do
        ready_r.close
        before&.call
        requests.times do |i|
          _status, _headers, body = app.call(Memkit::Warmup::App.env(path((i * WORKERS) + k)))
          body.each { |_| nil }
          body.close if body.respond_to?(:close)
        end
        GC.start(full_mark: gc == "full", immediate_sweep: true) unless gc == "none"
        ready_w.write("r")
        sleep
      end
    end
    ready_w.close
    ready_r.read(WORKERS)
    yield pids
  ensure
    pids&.each { |pid| Process.kill(:KILL, pid) }
    pids&.each { |pid| Process.wait(pid) }
  end

  def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

  def mb(bytes) = format("%.1f", bytes / 1_000_000.0)

  def mean(values) = values.sum.fdiv(values.size)

  def seed
    return if File.exist?(DB)

    code = 'require "./app"; Rails.application.initialize!; BenchRails.seed'
    system(env_for("plain", 0), "bundle", "exec", "ruby", "-e", code, chdir: DIR, exception: true)
  end

  def main(argv)
    opts = { servers: %w[unicorn puma], modes: nil, counts: [500, 2000], repeat: 1, out: nil, report: nil,
             lock: nil, hold: 480, step: 500 }
    OptionParser.new do |o|
      o.on("--servers LIST", Array) { |v| opts[:servers] = v }
      o.on("--modes LIST", Array) { |v| opts[:modes] = v }
      o.on("--counts LIST", Array, "requests per worker at which to measure (default 500,2000)") do |v|
        opts[:counts] = v.map { |c| Integer(c) }
      end
      o.on("--repeat N", Integer) { |v| opts[:repeat] = v }
      o.on("--out FILE", "append each measurement as a JSON line") { |v| opts[:out] = v }
      o.on("--report FILE", "print the table of the measurements in FILE, run nothing") { |v| opts[:report] = v }
      o.on("--lock FILE", "hold an flock on FILE while booting, driving and reading, --hold seconds at a time") do |v|
        opts[:lock] = v
      end
      o.on("--hold SECONDS", Integer, "longest single hold of --lock (480)") { |v| opts[:hold] = v }
      o.on("--step N", Integer, "requests per worker between chances to let go of --lock (500)") do |v|
        opts[:step] = v
      end
    end.parse!(argv)
    if opts[:report]
      rows = File.readlines(opts[:report]).map { |l| JSON.parse(l, symbolize_names: true) }
      return report(rows)
    end
    opts[:modes] ||= ["plain", Process.respond_to?(:warmup) ? "process_warmup" : "nakayoshi", "memkit"]
    seed
    puts "cow_rails: ruby #{RUBY_VERSION}, 4 workers, requests per worker #{opts[:counts].join(', ')}, " \
         "#{Time.now.utc.strftime('%F %H:%M')} UTC"
    rows = []
    lock = Lock.new(opts[:lock], opts[:hold])
    opts[:servers].each do |name|
      opts[:modes].each do |mode|
        opts[:repeat].times do
          lock.acquire
          server = start(name, mode)
          begin
            done = 0
            opts[:counts].each do |count|
              while done < count
                done = [done + opts[:step], count].min
                drive(server, done)
                lock.breathe
              end
              m = measure(server)
              row = { server: name, mode: mode, count: count, ruby: RUBY_VERSION, **m }
              rows << row
              File.open(opts[:out], "a") { |f| f.puts(JSON.generate(row)) } if opts[:out]
              $stderr.puts format("%s %s %d: tree %s MB, master pss %s, worker uss %s (max %s), shared %.1f%%, " \
                                  "reforks %d, %s UTC", name, mode, count, mb(m[:tree]), mb(m[:master_pss]),
                                  mb(mean(m[:uss])), mb(m[:uss].max), mean(m[:shared]), m[:reforks],
                                  Time.now.utc.strftime("%H:%M"))
            end
          ensure
            stop(server)
            lock.release
          end
        end
      end
    end
    report(rows)
  end

  def report(rows)
    cells = rows.sort_by { |r| [r[:server], r[:count]] }.map do |r|
      [r[:server], r[:mode], r[:count], mb(r[:tree]), mb(r[:master_pss]), mb(mean(r[:uss])), mb(r[:uss].max),
       format("%.1f", mean(r[:shared])), mb(r[:master_rss]), r[:reforks].to_i]
    end
    header = %w[server mode req/worker tree_pss_MB master_pss_MB worker_uss_MB max_uss_MB shared% master_rss_MB
                reforks]
    puts Memkit::CLI.table(header, cells, left: [0, 1])
    rows.group_by { |r| [r[:server], r[:count]] }.each do |(server, count), list|
      tree = ->(mode) { (t = list.select { |r| r[:mode] == mode }).empty? ? nil : mean(t.map { |r| r[:tree] }) }
      plain = tree.call("plain")
      best = ANCHORS.filter_map { |a| (v = tree.call(a)) && [a, v] }.min_by(&:last)
      list.map { |r| r[:mode] }.uniq.each do |mode|
        line = format("%-8s %6d %-16s tree %7s MB", server, count, mode, mb(tree.call(mode)))
        line << format("  %.2fx plain", tree.call(mode) / plain) if plain
        line << format("  %.2fx %s", tree.call(mode) / best[1], best[0]) if best
        puts line
      end
    end
    puts "tree_pss: total PSS of master + 4 workers after the requests and a full GC in each worker"
    puts "worker_uss: a worker's private memory; shared%: of the master's rss, exact (pagemap) where readable"
  end
end

CowRails.main(ARGV) if $PROGRAM_NAME == __FILE__
