# frozen_string_literal: true

require "test_helper"
require "support/servers"
require "support/pitchfork_server"
require "fileutils"
require "net/http"

class MemoryLimitTest < Minitest::Test
  include Memkit::ServersHelper

  def app(**options) = Memkit::MemoryLimit.new(->(_env) { [200, {}, ["ok"]] }, **options)

  def test_options_are_checked_at_construction
    assert_raises(Memkit::InvalidArgument) { app }
    error = assert_raises(Memkit::InvalidArgument) { app(max_uss: "3XB") }
    assert_match(/max_uss/, error.message)
    assert_raises(Memkit::InvalidArgument) { app(max_uss: 0) }
    assert_raises(Memkit::InvalidArgument) { app(max_requests: -1) }
    assert_raises(Memkit::InvalidArgument) { app(max_uss: "1GB", jitter: 2) }
    assert_raises(Memkit::InvalidArgument) { app(max_uss: "1GB", replace: :NOSUCHSIG) }
    assert_raises(Memkit::Error) { app(max_uss: "1GB", check_every: 0) }
    assert_equal 300 * 1024 * 1024, app(max_uss: "300MB").max_uss
  end

  # Outside a known server nothing is signalled; a callable gets the reason.
  def test_max_requests_with_jitter_calls_replace_once
    reasons = []
    middleware = Memkit::MemoryLimit.new(->(_env) { [200, {}, ["ok"]] }, max_requests: 100, jitter: 0.2,
                                         replace: ->(why) { reasons << why }, logger: StringIO.new)
    150.times do
      env = { "rack.after_reply" => [] }
      middleware.call(env)
      env["rack.after_reply"].each(&:call)
    end
    limit = middleware.limits[:max_requests]
    assert_includes 80..100, limit
    assert_equal 1, reasons.size
    assert_match(/served #{limit} requests/, reasons.first)
  end

  # A Puma cluster worker, played in a child process (the middleware signals
  # its own process): once Puma's out_of_band hook has run, the worker that
  # has told a client to close sends itself SIGTERM from the hook, and only
  # once it has.
  def test_on_puma_the_worker_goes_from_the_out_of_band_hook
    reader, writer = IO.pipe
    pid = fork do
      reader.close
      Signal.trap(:TERM) { writer.write("TERM ") }
      log = StringIO.new
      config = Struct.new(:options).new({ workers: 2 })
      middleware = Memkit::MemoryLimit.new(->(_env) { [200, {}, ["ok"]] }, max_requests: 2, jitter: 0, logger: log)
      request = lambda do
        env = { "SERVER_SOFTWARE" => "Puma 8.0.2", "puma.config" => config, "rack.after_reply" => [] }
        _, headers, = middleware.call(env)
        env["rack.after_reply"].each(&:call)
        writer.write("close ") if headers["connection"] == "close"
        writer.write("hook ") if Memkit::MemoryLimit.out_of_band # Puma calls it when idle
      end
      3.times { request.call }
      sleep 0.2
      writer.write(log.string)
      exit!(0)
    end
    writer.close
    Process.wait(pid)
    out = reader.read
    # Request 2 reaches the limit; the hook after it finds no client told to
    # close yet; request 3 gets "connection: close" and the hook after it
    # sends SIGTERM, which arrives while the hook holds Puma.
    expected = /\Aclose TERM hook memkit: worker \d+ served 2 requests .*\(SIGTERM, from Puma's out_of_band hook\)\n\z/
    assert_match expected, out
  end

  def test_under_an_unknown_server_it_logs_and_does_not_signal
    log = StringIO.new
    middleware = Memkit::MemoryLimit.new(->(_env) { [200, {}, ["ok"]] }, max_uss: 1, jitter: 0, logger: log)
    _, _, body = middleware.call({ "SERVER_SOFTWARE" => "WEBrick" })
    body.close # no after_reply hook: the body's close is the signal
    assert_match(/uss .* > limit 1 B .*not restarting it: unknown server/, log.string)
  end

  LEAKY_APP = <<~RUBY
    require "memkit"
    LEAK = []
    use Memkit::MemoryLimit, max_uss: ENV.fetch("MAX_USS"), jitter: 0.2
    run lambda { |env|
      # 2 MiB that stay: the worker's USS grows with every request.
      LEAK << ("x" * (2 << 20)) unless env["PATH_INFO"] == "/ping"
      [200, { "content-type" => "text/plain" }, [Process.pid.to_s]]
    }
  RUBY

  # With `plugin :memkit` the worker asks for its replacement from Puma's
  # out_of_band hook; without it, from a thread that waits for an idle moment.
  def test_puma_cluster_replaces_bloated_workers_without_failed_requests
    recycle_under(:puma, extra: "plugin :memkit")
  end

  def test_puma_cluster_without_the_plugin_replaces_bloated_workers_without_failed_requests
    recycle_under(:puma)
  end

  def test_unicorn_replaces_bloated_workers_without_failed_requests
    recycle_under(:unicorn)
  end

  IDLE_APP = <<~'RUBY'
    require "memkit"
    use Memkit::MemoryLimit, max_requests: 3, jitter: 0
    run ->(_env) { [200, { "content-type" => "text/plain" }, [Process.pid.to_s]] }
  RUBY

  # Signalled mid-request, a Unicorn or Pitchfork worker would wait for a
  # connection that never comes, up to half its `timeout` (30 s here), before
  # leaving; MemoryLimit wakes that wait.
  def test_a_replaced_worker_leaves_an_idle_unicorn_at_once
    leaves_when_idle(:unicorn)
  end

  def test_a_replaced_worker_leaves_an_idle_pitchfork_at_once
    leaves_when_idle(:pitchfork)
  end

  def leaves_when_idle(kind)
    if kind == :pitchfork
      begin
        Gem.bin_path("pitchfork", "pitchfork")
      rescue Gem::Exception
        skip "needs the pitchfork gem (bundle install)"
      end
    end

    Dir.mktmpdir("memkit-idle") do |dir|
      server =
        if kind == :pitchfork
          Memkit::PitchforkServer.start_pitchfork(IDLE_APP, dir: dir, port: free_port, workers: 1)
        else
          start_server(kind, IDLE_APP, dir: dir, port: free_port, workers: 1)
        end
      begin
        pattern = /memkit: worker (\d+) .*asking #{kind} to replace it \(SIGQUIT\)/
        pid = wait_until(timeout: 30, message: "a replacement under #{kind}") do
          Net::HTTP.get(URI("http://127.0.0.1:#{server.port}/"))
          server.log_text[pattern, 1]&.to_i
        end
        assert_operator pid, :>, 0
        # No request from here on.
        wait_until(timeout: 10, interval: 0.1, message: "worker #{pid} to leave the idle #{kind}") do
          !File.exist?("/proc/#{pid}") || File.read("/proc/#{pid}/stat")[/\) (\w)/, 1] == "Z"
        rescue Errno::ENOENT, Errno::ESRCH
          true
        end
      ensure
        Memkit::ServersHelper.stop_server(server)
      end
    end
  end

  TREE_APP = <<~'RUBY'
    require "memkit"
    LEAK = []
    use Memkit::MemoryLimit, max_tree_pss: "80%", cgroup: ENV.fetch("CGROUP_ROOT"), tree_check_interval: 0.2
    run lambda { |env|
      # The title as the kernel has it (Pitchfork sets it with setproctitle).
      nr = File.read("/proc/self/cmdline")[/worker\[(\d+)\]/, 1].to_i
      # Worker N keeps 4 MiB per request up to (N + 1) x 16 MiB: the workers
      # end apart in size, whichever served more requests.
      LEAK << ("x" * (4 << 20)) if env["PATH_INFO"] == "/leak" && LEAK.size < (nr + 1) * 4
      state = LEAK.size == (nr + 1) * 4 ? "full" : "growing"
      [200, { "content-type" => "text/plain" }, ["#{Process.pid} #{nr} #{state}"]]
    }
  RUBY

  # The container's limit is a cgroup tree the test writes (memory.max), so it
  # can be lowered below what the real server tree holds; the server, its
  # workers and their memory are real. Over the limit, the largest worker by
  # USS is replaced, only it, and the others keep serving.
  def test_tree_over_a_share_of_the_container_limit_replaces_the_largest_unicorn_worker_only
    tree_limit_under(:unicorn)
  end

  # Pitchfork's mold is a child of the monitor too, and is not a worker: it
  # is counted in the tree but never picked.
  def test_tree_over_a_share_of_the_container_limit_replaces_the_largest_pitchfork_worker_only
    tree_limit_under(:pitchfork)
  end

  def tree_limit_under(kind)
    Dir.mktmpdir("memkit-tree-limit") do |dir|
      cgroup = File.join(dir, "cgroup")
      FileUtils.mkdir_p(["#{cgroup}/proc/self", "#{cgroup}/sys/fs/cgroup"])
      File.write("#{cgroup}/proc/self/cgroup", "0::/\n")
      File.write("#{cgroup}/proc/self/mountinfo", "30 20 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n")
      File.write("#{cgroup}/sys/fs/cgroup/memory.current", "1\n")
      File.write("#{cgroup}/sys/fs/cgroup/memory.events", "max 0\n")
      max_file = "#{cgroup}/sys/fs/cgroup/memory.max"
      File.write(max_file, "#{100 << 30}\n")
      server =
        if kind == :pitchfork
          Memkit::PitchforkServer.start_pitchfork(TREE_APP, dir: dir, port: free_port, workers: 3,
                                                            env: { "CGROUP_ROOT" => cgroup })
        else
          start_server(kind, TREE_APP, dir: dir, port: free_port, workers: 3, env: { "CGROUP_ROOT" => cgroup })
        end
      begin
        client = Memkit::ServersHelper::KeepAliveClient.new(server.port)
        workers = {}
        lock = Mutex.new
        # Three clients at once, so every worker gets requests.
        Array.new(3) do
          Thread.new do
            c = Memkit::ServersHelper::KeepAliveClient.new(server.port)
            3000.times do
              break if lock.synchronize { workers.size == 3 && workers.values.all? }

              pid, _nr, state = c.get("/leak")[2].split
              lock.synchronize { workers[pid.to_i] ||= state == "full" }
              lock.synchronize { workers[pid.to_i] = true } if state == "full"
            end
            c.close
          end
        end.each(&:join)
        assert_equal 3, workers.size
        assert workers.values.all?, "every worker full: #{workers.inspect}"
        tree = Memkit.tree(server.pid)
        uss = tree.nodes.select { |n| workers.key?(n.pid) }.to_h { |n| [n.pid, n.memory.uss] }
        largest = uss.max_by { |_, v| v }.first
        # 80% of the new limit is 4 MiB under the tree: over, and replacing
        # the largest worker (tens of MiB) brings it back under.
        File.write(max_file, "#{((tree.total_pss - (4 << 20)) / 0.8).ceil}\n")
        # Pings from three clients at once (a worker acts only after a request
        # of its own): until one worker has been replaced, then 2 s more, in
        # which no other may go and the others serve on.
        answered = Hash.new(0)
        stop = false
        pingers = Array.new(3) do
          Thread.new do
            c = Memkit::ServersHelper::KeepAliveClient.new(server.port)
            until stop
              pid = c.get("/ping")[2].to_i
              lock.synchronize { answered[pid] += 1 }
            end
            c.close
          end
        end
        begin
          wait_until(timeout: 30, interval: 0.1, message: "a tree-limit replacement (largest #{largest}, #{uss})") do
            server.log_text.include?("tree pss")
          end
          # Counted from when the replaced worker is gone (its master reaps it).
          wait_until(timeout: 30, message: "worker #{largest} to exit") { !File.exist?("/proc/#{largest}") }
          lock.synchronize { answered.clear }
          sleep 2
        ensure
          stop = true
          pingers.each(&:join)
        end
        replaced = server.log_text.scan(/memkit: worker (\d+) tree pss/).flatten.map(&:to_i)
        # The largest goes first. A worker the server is still winding down
        # counts in the tree's PSS but is no longer a candidate, so while it
        # exits the next largest may go too; the smallest keeps serving.
        assert_equal largest, replaced.first, "largest by USS was #{largest} (#{uss.inspect}):\n#{server.log_text[-2000..]}"
        refute_includes replaced, uss.min_by { |_, v| v }.first, "the smallest worker keeps serving"
        survivors = workers.keys - replaced
        survivors.each { |pid| assert_equal 1, Process.kill(0, pid), "worker #{pid} should still run" }
        assert_operator (answered.keys & survivors).size, :>=, 1, "answered by #{answered.inspect}"
        refute_includes answered.keys, largest
        sizes = uss.transform_values { |v| Memkit::Units.human(v) }
        puts "\ntree limit (#{kind}): worker uss #{sizes}; replaced #{replaced}"
      ensure
        client&.close
        stop_server(server)
      end
    end
  end

  private

  # Several keep-alive clients, each its own process (threads sharing one
  # GVL would stall between connect and write, which no real client does),
  # hammer a leaking app until the workers have been replaced at least 5
  # times; every request must get a 2xx response.
  def recycle_under(kind, extra: "")
    Dir.mktmpdir("memkit-limit") do |dir|
      server = start_server(kind, LEAKY_APP, dir: dir, port: free_port, threads: 2,
                                             env: { "MAX_USS" => "90MB" }, check_path: "/ping", extra: extra)
      begin
        wanted = Integer(ENV.fetch("MEMKIT_RECYCLES", "5"))
        stop_file = File.join(dir, "stop")
        clients = Array.new(4) { |i| spawn_client(server.port, stop_file, File.join(dir, "client#{i}.out")) }
        seen = {}
        wait_until(timeout: 20 + 5 * wanted, interval: 0.2, message: "#{wanted} worker replacements under #{kind}") do
          clients.each do |c|
            File.foreach(c[:out]) { |l| seen[l.to_i] = true if l.match?(/\A\d+$/) } if File.exist?(c[:out])
          end
          seen.size >= 2 + wanted ||
            clients.any? { |c| Process.waitpid(c[:pid], Process::WNOHANG) && (c[:done] = true) }
        end
        File.write(stop_file, "")
        results = clients.map do |c|
          Process.waitpid(c[:pid]) unless c[:done]
          c[:done] = true
          lines = File.readlines(c[:out], chomp: true)
          lines.each { |l| seen[l.to_i] = true if l.match?(/\A\d+\z/) }
          lines
        end
        errors = results.flatten.grep(/\AFAIL/)
        summaries = results.map { |lines| lines.grep(/\Adone/).first.to_s }
        served = results.flatten.grep(/\A\d+\z/).size
        log = server.log_text
        signal = kind == :puma ? "TERM" : "QUIT"
        replaced = log.scan(/memkit: worker \d+ uss .* asking #{kind} to replace it \(SIG#{signal}[,)]/i)
        assert_empty errors, "failed requests under #{kind} (#{served} served):\n#{errors.first(5).join("\n")}"
        assert_operator seen.size - 2, :>=, wanted, "worker pids seen: #{seen.size}"
        assert_operator replaced.size, :>=, wanted, "replacement log lines:\n#{log[-3000..]}"
        # How many went from the hook depends on the worker having idle
        # moments (Puma runs the hook only then); the thread covers the rest.
        from_hook = log.scan(/from Puma's out_of_band hook/).size
        assert_equal 0, from_hook unless extra.include?("plugin :memkit")
        puts "\n#{kind}#{" (#{extra})" unless extra.empty?}: #{served} requests, #{seen.size} worker pids, " \
             "#{replaced.size} replacements logged (#{from_hook} from the out_of_band hook); " \
             "per client: #{summaries.join('; ')}"
      ensure
        File.write(stop_file, "") if stop_file
        clients&.each do |c|
          next if c[:done]

          begin
            Process.kill(:KILL, c[:pid])
            Process.waitpid(c[:pid])
          rescue Errno::ESRCH, Errno::ECHILD
            nil
          end
        end
        stop_server(server)
      end
    end
  end

  # One client process: GET /leak in a loop on a keep-alive connection,
  # writing each responding pid, or FAIL and the reason, one per line.
  def spawn_client(port, stop_file, out)
    pid = fork do
      File.open(out, "w") do |f|
        f.sync = true
        client = Memkit::ServersHelper::KeepAliveClient.new(port)
        until File.exist?(stop_file)
          begin
            f.puts client.get("/leak")[2].to_i
          rescue Memkit::ServersHelper::KeepAliveClient::Failure, SystemCallError, IOError => e
            f.puts "FAIL #{e.class}: #{e.message}"
          end
        end
        f.puts "done: #{client.connections} connections, #{client.stale_reconnects} stale keep-alive reconnects, " \
               "#{client.retries_after_send} retries after send, " \
               "#{client.unanswered_fresh} new connections closed unanswered and retried"
      end
      exit!(0)
    end
    { pid: pid, out: out }
  end
end
