# frozen_string_literal: true

# Reforking on real Puma: the server tree's memory after the same requests
# when nothing reforks, when Puma reforks on its own request count
# (fork_worker 1000), and when memkit's policy decides (plugin :memkit).
# Boots bench/refork_puma.rb (4 workers, fork_worker) once per mode, sends
# requests from 8 clients over 127.0.0.1 until the total reaches each
# checkpoint times the workers, has every worker run a full GC, and reads
# the tree from /proc: total PSS, the master's, worker 0's and the other
# workers' USS, and how many reforks Puma logged.
#
#   flock /tmp/memkit-bench.lock bundle exec ruby bench/refork.rb \
#     [--per-worker 2000,5000,10000] [--modes none,count,memkit] [--workers 4]
#     [--app refork_app.ru|cow_app.ru] [--rate REQUESTS_PER_SECOND]
$LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
require "memkit"
require "memkit/loopback"
require "net/http"
require "optparse"
require "rbconfig"
require "tmpdir"

module ReforkBench
  ROOT = File.expand_path("..", __dir__)
  MIB = 1_048_576.0

  module_function

  def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

  def start(mode, workers:, app:)
    port = Memkit::Loopback.free_port
    log = File.join(Dir.tmpdir, "memkit-refork-#{mode}-#{port}.log")
    env = { "REFORK_MODE" => mode, "REFORK_PORT" => port.to_s, "REFORK_WORKERS" => workers.to_s,
            "REFORK_APP" => app }
    config = File.join(ROOT, "bench", "refork_puma.rb")
    argv = [RbConfig.ruby, Gem.bin_path("puma", "puma"), "-C", config]
    pid = Process.spawn(env, *argv, chdir: ROOT, out: log, err: log, pgroup: true)
    deadline = now + 180
    until get(port, "/gc") && Memkit.tree(pid).nodes.size == workers + 1
      raise "puma (#{mode}) did not boot; log #{log}:\n#{File.read(log)[-2000..]}" if now > deadline

      sleep 0.2
    end
    { mode: mode, pid: pid, port: port, log: log }
  end

  def stop(server)
    Process.kill(:TERM, server[:pid])
    deadline = now + 30
    sleep 0.1 until Process.wait(server[:pid], Process::WNOHANG) || now > deadline
  rescue Errno::ESRCH, Errno::ECHILD
    nil
  ensure
    begin
      Process.kill(:KILL, -server[:pid]) # workers left behind, if any
    rescue Errno::ESRCH
      nil
    end
  end

  def get(port, path)
    Net::HTTP.start("127.0.0.1", port, open_timeout: 5, read_timeout: 60) { |h| h.get(path).body }
  rescue SystemCallError, Net::OpenTimeout, Net::ReadTimeout, EOFError, IOError
    nil
  end

  # Sends requests number `from` up to `to` (k = the request's number), from
  # `clients` threads, each reconnecting every 20 requests so that the
  # connections spread over the workers. With a rate (requests per second
  # in all), request k is not sent before start + k / rate: the policy
  # decides on a clock, so an unpaced run squeezes hours of traffic into
  # seconds of its checks.
  def drive(server, from, to, clients: 8, rate: nil, start: now)
    counter = from
    lock = Mutex.new
    take = lambda do
      k = lock.synchronize { counter < to ? (counter += 1) : nil }
      if k && rate
        wait = start + k.fdiv(rate) - now
        sleep(wait) if wait.positive?
      end
      k
    end
    failures = 0
    Array.new(clients) do
      Thread.new do
        while (k = take.call)
          begin
            Net::HTTP.start("127.0.0.1", server[:port], read_timeout: 60) do |http|
              20.times do
                http.get("/?k=#{k}").value
                break unless (k = take.call)
              end
            end
          rescue SystemCallError, EOFError, IOError, Net::ReadTimeout, Net::HTTPError, Net::HTTPFatalError
            lock.synchronize { failures += 1 }
          end
        end
      end
    end.each(&:join)
    failures
  end

  # A full GC in every process serving requests: /gc holds its worker for a
  # second, so concurrent calls reach distinct workers; repeated until each
  # worker pid answered once.
  def gc_all(server, workers)
    seen = {}
    deadline = now + 120
    until seen.size >= workers
      raise "not every worker ran /gc: #{seen.keys}" if now > deadline

      Array.new(workers) { Thread.new { get(server[:port], "/gc?hold=1.5") } }.each do |t|
        pid = t.value.to_s[/\Apid=(\d+)/, 1]
        seen[pid.to_i] = true if pid
      end
      current = Memkit.tree(server[:pid]).nodes.drop(1).map(&:pid)
      seen.select! { |pid, _| current.include?(pid) }
    end
    seen.keys.sort
  end

  # A refork that starts during the GC round or the reading would leave a
  # worker out of the tree (or count one that did not GC): read again until
  # the tree at the reading is exactly the workers that ran the GC.
  def measure(server, workers)
    loop do
      sleep 0.5 until Memkit.tree(server[:pid]).nodes.size == workers + 1
      collected = gc_all(server, workers)
      tree = Memkit.tree(server[:pid])
      pids = tree.nodes.drop(1).map(&:pid).sort
      next unless pids == collected && tree.nodes.count { |n| n.depth == 2 } == workers - 1

      log = File.read(server[:log])
      return {
        total_pss: tree.total_pss, master_pss: tree.root.memory.pss,
        worker0_uss: tree.nodes.find { |n| n.depth == 1 }&.memory&.uss.to_i,
        workers_uss: tree.nodes.select { |n| n.depth == 2 }.map { |n| n.memory.uss },
        reforks: log.scan("Starting worker refork").size,
        memkit_decisions: log.scan("memkit: refork (").size
      }
    end
  end

  def run(modes:, per_worker:, workers:, app:, rate: nil)
    rows = []
    modes.each do |mode|
      server = start(mode, workers: workers, app: app)
      sent = 0
      failures = 0
      began = now
      paused = 0.0 # time spent measuring, left out of the pacing
      begin
        per_worker.each do |n|
          t0 = now
          failures += drive(server, sent, n * workers, rate: rate, start: began + paused)
          sent = n * workers
          t1 = now
          m = measure(server, workers)
          paused += now - t1
          rows << m.merge(mode: mode, per_worker: n, seconds: now - t0, failures: failures)
          puts format("%-7s %6d/worker  tree PSS %7.1f MiB  master PSS %6.1f  worker0 USS %6.1f  " \
                      "workers USS %s  reforks %d (memkit decided %d)  failed requests %d  %.0fs",
                      mode, n, m[:total_pss] / MIB, m[:master_pss] / MIB, m[:worker0_uss] / MIB,
                      m[:workers_uss].map { |u| format("%.1f", u / MIB) }.join("/"), m[:reforks],
                      m[:memkit_decisions], failures, now - t0)
          $stdout.flush
        end
      ensure
        stop(server)
      end
    end
    summary(rows)
    rows
  end

  # Per mode: the tree's PSS averaged over the checkpoints (what the tree
  # costs over the run, not at one moment) and at the last one.
  def summary(rows)
    puts "mode     mean tree PSS over checkpoints   last checkpoint   reforks"
    rows.group_by { |r| r[:mode] }.each do |mode, rs|
      mean = rs.sum { |r| r[:total_pss] } / rs.size
      puts format("%-7s  %10.1f MiB (%2d checkpoints)   %9.1f MiB   %7d", mode, mean / MIB, rs.size,
                  rs.last[:total_pss] / MIB, rs.last[:reforks])
    end
  end
end

if $PROGRAM_NAME == __FILE__
  opts = { modes: %w[none count memkit], per_worker: [2000, 5000, 10_000], workers: 4, app: "refork_app.ru" }
  OptionParser.new do |o|
    o.on("--modes LIST") { |v| opts[:modes] = v.split(",") }
    o.on("--per-worker LIST") { |v| opts[:per_worker] = v.split(",").map { |x| Integer(x) } }
    o.on("--workers N", Integer) { |v| opts[:workers] = v }
    o.on("--app FILE", %w[refork_app.ru cow_app.ru]) { |v| opts[:app] = v }
    o.on("--rate N", Float, "requests per second in all (default: as fast as the server answers)") do |v|
      opts[:rate] = v
    end
  end.parse!
  puma = Gem.loaded_specs["puma"]&.version
  puts "ruby #{RUBY_VERSION}, puma #{puma}, #{opts[:workers]} workers, app bench/#{opts[:app]}, " \
       "requests per worker (average): #{opts[:per_worker].join(', ')}, rate #{opts[:rate] || 'unpaced'}"
  ReforkBench.run(**opts)
end
