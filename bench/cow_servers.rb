# frozen_string_literal: true

# Copy-on-write on real servers: boots bench/cow_app.ru on Unicorn and on
# Puma (cluster) with 4 workers, once per way of preparing the master, sends
# each worker N requests over 127.0.0.1, has every worker run a full GC, then
# measures each worker's sharing with its master with memkit (pagemap frames)
# and cross-checks with smem (shared = rss - uss).
#
#   bundle exec ruby bench/cow_servers.rb [--requests 2000] [--scale 1]
#       [--servers unicorn,puma] [--modes none,nakayoshi,puma_old,hook,nofill]
#
# test/memkit/servers_fork_test.rb uses CowServers with small numbers.
$LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
require "memkit"
require "memkit/cow"
require "memkit/loopback"
require "net/http"
require "json"
require "socket"
require "tmpdir"
require "rbconfig"

module CowServers
  ROOT = File.expand_path("..", __dir__)
  CONFIGS = { "unicorn" => "cow_unicorn.rb", "puma" => "cow_puma.rb" }.freeze

  Server = Struct.new(:name, :mode, :pid, :port, :log, keyword_init: true)

  module_function

  def free_port = Memkit::Loopback.free_port

  # Boots a server in the background; returns once all workers answer.
  def start(name, mode, port: free_port, workers: 4, scale: 1.0, requests: nil, log: nil, timeout: 120)
    log ||= File.join(Dir.tmpdir, "memkit-cow-#{name}-#{port}.log")
    config = File.join(ROOT, "bench", CONFIGS.fetch(name))
    argv = if name == "unicorn"
             [RbConfig.ruby, Gem.bin_path("unicorn", "unicorn"), "-c", config, File.join(ROOT, "bench", "cow_app.ru")]
           else
             [RbConfig.ruby, Gem.bin_path("puma", "puma"), "-C", config]
           end
    env = { "COW_MEMKIT" => mode, "COW_PORT" => port.to_s, "COW_WORKERS" => workers.to_s, "COW_APP_SCALE" => scale.to_s,
            "COW_APP_REQUESTS" => requests&.to_s }
    pid = Process.spawn(env, *argv, chdir: ROOT, out: log, err: log, pgroup: true)
    server = Server.new(name: name, mode: mode, pid: pid, port: port, log: log)
    deadline = now + timeout
    until worker_pids(server).size == workers && get(port, "/memkit")
      raise "#{name} (#{mode}) did not boot in #{timeout}s; log #{log}:\n#{File.read(log)[-2000..]}" if now > deadline || !alive?(pid)

      sleep 0.2
    end
    server
  end

  def stop(server)
    return unless server

    # The server's graceful stop (with QUIT, Puma's master stayed up until
    # the 20 s below ran out).
    Process.kill(Memkit::MemoryLimit::SIGNALS.fetch(server.name.to_sym), server.pid) rescue nil
    deadline = now + 20
    sleep 0.1 while alive?(server.pid) && now < deadline && !Process.wait(server.pid, Process::WNOHANG)
    Process.kill(:KILL, -server.pid) rescue nil
    Process.wait(server.pid) rescue nil
  end

  def alive?(pid)
    Process.kill(0, pid)
    true
  rescue Errno::ESRCH
    false
  end

  def worker_pids(server)
    Memkit::Cow.children(server.pid)
  end

  def get(port, path)
    Net::HTTP.start("127.0.0.1", port, open_timeout: 5, read_timeout: 60) { |http| http.get(path).body }
  rescue SystemCallError, Net::OpenTimeout, EOFError, IOError
    nil
  end

  # Sends requests from `clients` threads until every worker has served at
  # least `per_worker` (each response names its pid and its count). A kept-
  # alive connection stays with one Puma worker, so a client whose worker
  # has served enough asks for a new connection: otherwise a worker that
  # no connection reached waited for Puma to drop one (41 s in a test).
  def drive(server, per_worker, clients: 8, timeout: 600)
    counts = Hash.new(0)
    lock = Mutex.new
    deadline = now + timeout
    done = -> { lock.synchronize { counts.size >= worker_pids(server).size && counts.values.min >= per_worker } }
    Array.new(clients) do
      Thread.new do
        Net::HTTP.start("127.0.0.1", server.port, read_timeout: 60) do |http|
          enough = false
          until done.call || now > deadline
            request = Net::HTTP::Get.new("/")
            request["Connection"] = "close" if enough # Net::HTTP connects again for the next one
            body = http.request(request).body
            m = body.match(/\Apid=(\d+) count=(\d+)/) or next
            pid, count = m[1].to_i, m[2].to_i
            lock.synchronize { counts[pid] = [counts[pid], count].max }
            enough = count >= per_worker
          end
        end
      rescue SystemCallError, EOFError, IOError, Net::ReadTimeout
        retry unless done.call || now > deadline
      end
    end.each(&:join)
    raise "workers did not reach #{per_worker} requests in #{timeout}s: #{counts}" unless done.call

    counts
  end

  SAMPLE_EVERY = 2

  # The tree's total PSS while the block runs (what the server costs while
  # it serves, between its GCs, rather than right after a full GC): the mean
  # of readings every SAMPLE_EVERY seconds over the second half of the run,
  # after the workers' warm-up. nil if the block ran too briefly.
  def sample_tree(server)
    samples = []
    sampler = Thread.new do
      loop do
        sleep SAMPLE_EVERY
        samples << Memkit::Tree.read(server.pid).total_pss
      rescue Memkit::Error
        nil # a process exited mid-read: skip that reading
      end
    end
    yield
    sampler.kill.join
    late = samples.drop(samples.size / 2)
    late.empty? ? nil : late.sum / late.size
  end

  # /gc holds its worker for `hold` seconds after its GC, so concurrent
  # calls land on distinct workers, and MallocRelease's thread (a look a
  # second) has trimmed after it; repeats until every worker has run one.
  def gc_all(server, hold: 1.5, timeout: 120, trim: false)
    want = worker_pids(server)
    seen = {}
    deadline = now + timeout
    until (want - seen.keys).empty?
      raise "not every worker ran /gc in #{timeout}s: #{seen.keys} of #{want}" if now > deadline

      Array.new(want.size) { Thread.new { get(server.port, "/gc?hold=#{hold}#{'&trim=1' if trim}") } }.each do |t|
        pid = t.value.to_s[/\Apid=(\d+)/, 1]
        seen[pid.to_i] = true if pid
      end
    end
    seen.keys
  end

  # What the user pays first: the tree's total PSS (master + workers) and
  # each worker's USS; then sharing, memkit's exact figures and smem's
  # (rss - uss) over the master's rss.
  def measure(server)
    tree = Memkit::Tree.read(server.pid)
    cow = Memkit::Cow.read(server.pid)
    smem = smem_shared(server.pid, cow.workers.map(&:pid))
    workers = tree.nodes.reject { |n| n.pid == server.pid }
    { tree_pss: tree.total_pss, master_pss: tree.nodes.find { |n| n.pid == server.pid }.memory.pss,
      worker_uss: workers.map { |n| n.memory.uss },
      master_rss: cow.master_rss, method: cow.method,
      workers: cow.workers.map do |w|
        { pid: w.pid, shared_pct: w.shared_pct, private_dirty: w.private_dirty,
          smem_shared_pct: smem[:workers][w.pid] && (100.0 * smem[:workers][w.pid] / smem[:master]).round(2) }
      end }
  end

  # Each worker's private pages (no other process of the tree maps the
  # frame), copied (the master maps the address) or new, by the mapping that holds them: brk (malloc's main arena, and
  # Ruby's heap pages on 3.1/3.2), anon (Ruby's heap pages on 3.3+, other
  # arenas, large mallocs), file, stack. Needs root (pagemap frames).
  def private_by_kind(server)
    pids = [server.pid] + worker_pids(server)
    frames = pids.to_h { |pid| [pid, page_frames(pid)] }
    sharers = Hash.new(0)
    frames.each_value { |f| f.each_value { |pfn| sharers[pfn] += 1 } }
    pids.to_h do |pid|
      kinds = mapping_kinds(pid)
      h = Hash.new(0)
      master = frames[server.pid]
      frames[pid].each do |addr, pfn|
        next unless sharers[pfn] == 1

        # "copied": the master maps this address too (a page the worker wrote
        # after fork); "new": memory the worker got after fork.
        origin = pid == server.pid || master.key?(addr) ? "copied" : "new"
        h["#{kinds.call(addr)} #{origin}"] += Memkit::ProcFS::PAGE_SIZE
      end
      [pid, h]
    end
  end

  # Each worker's /stat (GC.stat, mallinfo2) by pid, reached like gc_all.
  def stat_all(server, hold: 1.0, timeout: 60)
    want = worker_pids(server)
    seen = {}
    deadline = now + timeout
    until (want - seen.keys).empty? || now > deadline
      Array.new(want.size) { Thread.new { get(server.port, "/stat?hold=#{hold}") } }.each do |t|
        info = (JSON.parse(t.value.to_s) rescue nil) or next
        seen[info["pid"]] = info
      end
    end
    seen
  end

  def page_frames(pid)
    out = {}
    Memkit::Cow.frames(pid).each do |start, _, entries|
      entries.each_with_index do |v, i|
        out[start + i * Memkit::ProcFS::PAGE_SIZE] = v & Memkit::Cow::PFN_MASK if v & Memkit::Cow::PRESENT != 0
      end
    end
    out
  end

  def mapping_kinds(pid)
    ranges = File.readlines("/proc/#{pid}/maps").map do |line|
      f = line.split(" ", 6)
      s, e = f[0].split("-").map { |x| x.to_i(16) }
      kind = case f[5].to_s.strip
             when "[heap]" then "brk"
             when "", /\A\[anon/ then "anon"
             when /\[stack/ then "stack"
             else "file"
             end
      [s, e, kind]
    end
    ->(addr) { (r = ranges.bsearch { |_, e, _| e > addr }) && addr >= r[0] ? r[2] : "anon" }
  end

  def smem_shared(master, workers)
    out = IO.popen(["smem", "-H", "-c", "pid uss rss", "-P", "."], err: File::NULL, &:read)
    rows = out.lines.to_h { |l| pid, uss, rss = l.split.map(&:to_i); [pid, [uss, rss]] }
    { master: rows.dig(master, 1).to_i * 1024,
      workers: workers.to_h { |pid| uss, rss = rows[pid]; [pid, rss && (rss - uss) * 1024] } }
  rescue SystemCallError
    { master: 1, workers: {} }
  end

  def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

  def mb(bytes) = format("%.1f MB", bytes / 1_000_000.0)

  def main(argv)
    require "optparse"
    opts = { requests: 2000, scale: 1.0, servers: %w[unicorn puma], modes: nil, repeat: 1 }
    OptionParser.new do |o|
      o.on("--requests N", Integer) { |v| opts[:requests] = v }
      o.on("--scale X", Float) { |v| opts[:scale] = v }
      o.on("--servers LIST", Array) { |v| opts[:servers] = v }
      o.on("--modes LIST", Array) { |v| opts[:modes] = v }
      o.on("--repeat N", Integer, "boots per mode (default 1)") { |v| opts[:repeat] = v }
      o.on("--pages", "also each process's private MB by mapping (brk, anon, file, stack)") { opts[:pages] = true }
    end.parse!(argv)
    puts "cow_servers: ruby #{RUBY_VERSION}, #{opts[:requests]} requests per worker, app scale #{opts[:scale]}, 4 workers"
    rows = []
    opts[:servers].each do |name|
      modes = opts[:modes] || (name == "puma" ? %w[none nakayoshi puma_old plugin plugin+fork] : %w[none nakayoshi puma_old hook hook+fork])
      modes.each do |mode|
        opts[:repeat].times do
          server = start(name, mode, scale: opts[:scale], requests: opts[:requests])
          begin
            started = now
            counts = nil
            load = sample_tree(server) { counts = drive(server, opts[:requests]) }
            rate = counts.values.sum / (now - started)
            gc_all(server)
            m = measure(server)
            if opts[:pages]
              private_by_kind(server).each do |pid, h|
                role = pid == server.pid ? "master" : "worker"
                puts format("  %s %s %-6s %d private: %s", name, mode, role, pid,
                            h.sort.map { |k, v| "#{k} #{mb(v)}" }.join(", "))
              end
              stat_all(server).each do |pid, info|
                gc = info["gc"]
                malloc = info["malloc"] || {}
                puts format("  %s %s worker %d gc count %d major %d pages %d live %d free %d; " \
                            "malloc arena %s in use %s free %s top %s mmapped %s",
                            name, mode, pid, gc["count"], gc["major_gc_count"], gc["heap_allocated_pages"],
                            gc["heap_live_slots"], gc["heap_free_slots"], mb(malloc["arena"].to_i),
                            mb(malloc["uordblks"].to_i), mb(malloc["fordblks"].to_i), mb(malloc["keepcost"].to_i),
                            mb(malloc["hblkhd"].to_i))
              end
              # What is left once each worker hands glibc's free pages back:
              # how much of a worker's memory is free malloc memory.
              gc_all(server, trim: true)
              t = Memkit::Tree.read(server.pid)
              uss = t.nodes.reject { |n| n.pid == server.pid }.map { |n| n.memory.uss }
              puts format("  %s %s after a full GC and malloc_trim(0) in each worker: tree %s, worker uss %s",
                          name, mode, mb(t.total_pss), mb(uss.sum / uss.size))
            end
            shared = m[:workers].map { |w| w[:shared_pct] }
            smem = m[:workers].map { |w| w[:smem_shared_pct] }.compact
            rows << { server: name, mode: mode, tree: m[:tree_pss], load: load,
                      cells: [name, mode, mb(m[:tree_pss]), load ? mb(load) : "-", mb(m[:master_pss]), mb(m[:worker_uss].sum / m[:worker_uss].size),
                              mb(m[:worker_uss].max), mb(m[:master_rss]), format("%.1f", shared.sum / shared.size),
                              smem.empty? ? "-" : format("%.1f", smem.min)] }
            # One line per boot as it ends, so a run cut short still shows what it measured.
            puts format("%s %s: tree %s (under load %s), master pss %s, worker uss %s (max %s), %.0f req/s", name, mode,
                        mb(m[:tree_pss]), load ? mb(load) : "-", mb(m[:master_pss]),
                        mb(m[:worker_uss].sum / m[:worker_uss].size), mb(m[:worker_uss].max), rate)
            $stdout.flush
          ensure
            stop(server)
          end
        end
      end
    end
    puts Memkit::CLI.table(%w[server mode tree_pss tree_load master_pss worker_uss max_uss master_rss mean_shared% smem_min_shared%],
                           rows.map { |r| r[:cells] }, left: [0, 1])
    rows.group_by { |r| r[:server] }.each do |server, list|
      mean = lambda do |mode, key = :tree|
        t = list.select { |r| r[:mode] == mode }.filter_map { |r| r[key] }
        t.empty? ? nil : t.sum.fdiv(t.size)
      end
      plain = mean.call("none")
      anchors = %w[nakayoshi process_warmup puma_old].filter_map { |a| (v = mean.call(a)) && [a, v] }
      best = anchors.min_by(&:last)
      list.map { |r| r[:mode] }.uniq.each do |mode|
        line = format("%-8s %-16s tree %s", server, mode, mb(mean.call(mode)))
        line << format("  %.2fx plain", mean.call(mode) / plain) if plain
        line << format("  %.2fx best anchor (%s)", mean.call(mode) / best[1], best[0]) if best
        load = mean.call(mode, :load)
        best_load = best && mean.call(best[0], :load)
        line << format("; under load %s", mb(load)) if load
        line << format("  %.2fx best anchor", load / best_load) if load && best_load
        puts line
      end
    end
    puts "tree_pss = total PSS of master + workers after the requests and a full GC in each worker (what the server costs)"
    puts "tree_load = the tree's total PSS while serving: mean of readings every #{SAMPLE_EVERY} s over the second half of the requests"
    puts "worker_uss = a worker's private memory (mean and max); master_pss = the master's share of the tree"
    puts "shared% = pages each worker maps on the same physical frame as its master / master rss (memkit, pagemap)"
    puts "smem shared% = (worker rss - worker uss) / master rss"
  end
end

if $PROGRAM_NAME == __FILE__
  require "memkit/cli"
  CowServers.main(ARGV)
end
