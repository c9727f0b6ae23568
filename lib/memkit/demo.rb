# frozen_string_literal: true

require "net/http"
require "rbconfig"
require_relative "loopback"
require "tmpdir"

module Memkit
  # Boots the sample app on a real Unicorn (or Puma) with several workers on
  # 127.0.0.1, sends it requests, and reports the server's memory.
  class Demo
    APP = File.expand_path("demo/config.ru", __dir__)

    # Workers whose USS passes this during the demo's /leak requests are replaced.
    MAX_USS = "80MB"

    def initialize(workers: 4, requests: 400, server: nil, out: $stdout)
      @workers = workers
      @requests = requests
      @explicit = !server.nil?
      @server = server || (gem_available?("unicorn") || !gem_available?("puma") ? "unicorn" : "puma")
      @out = out
      @retried = 0
      raise InvalidArgument, "server: #{@server.inspect} (unicorn or puma)" unless %w[unicorn puma].include?(@server)
      raise Error, missing_server_message unless gem_available?(@server)
    end

    # Yields the master pid once all workers are up and the requests are done,
    # then shows OobGC and MemoryLimit at work.
    def run
      Dir.mktmpdir("memkit-demo") do |dir|
        @port = Loopback.free_port
        @log = File.join(dir, "server.log")
        @out.puts "Booting #{@server} with #{@workers} workers on 127.0.0.1:#{@port} (log: #{@log})"
        pid = Process.spawn({ "MEMKIT_DEMO_MAX_USS" => MAX_USS }, RbConfig.ruby, *command(dir, @port),
                            out: [@log, "a"], err: %i[child out], pgroup: true)
        begin
          wait_for_workers(pid)
          elapsed = send_requests(@requests.times.map { |i| "/products/#{i * 37}" })
          @out.puts format("Sent %d requests in %.1fs.", @requests, elapsed), ""
          yield pid
          # OobGC before the leak: its counts then come from workers that
          # MemoryLimit is not about to replace.
          oob_gc
          recycle(pid)
        ensure
          stop(pid)
        end
      end
    end

    private

    # Both servers preload the app and run Memkit.warmup in the master before
    # forking, through their public hooks, so workers start sharing the most.
    def command(dir, port)
      config = File.join(dir, "#{@server}.rb")
      if @server == "unicorn"
        File.write(config, <<~RUBY)
          worker_processes #{@workers}
          listen "127.0.0.1:#{port}"
          preload_app true
          pid #{File.join(dir, 'unicorn.pid').inspect}
          before_fork { |_server, _worker| Memkit.warmup }
          after_fork { |_server, worker| Memkit::Metrics.worker_booted(worker.nr) }
        RUBY
        [Gem.bin_path("unicorn", "unicorn"), "-c", config, APP]
      else
        File.write(config, <<~RUBY)
          workers #{@workers}
          threads 1, 4
          bind "tcp://127.0.0.1:#{port}"
          preload_app!
          plugin :memkit
          rackup #{APP.inspect}
        RUBY
        [Gem.bin_path("puma", "puma"), "-C", config]
      end
    end

    def wait_for_workers(pid)
      deadline = clock + 60
      until Tree.read(pid).nodes.size > @workers && Loopback.listening?(@port)
        if Process.waitpid(pid, Process::WNOHANG) || clock > deadline
          raise Error, "#{@server} did not start: #{File.read(@log).lines.last(5).join.strip}"
        end

        sleep 0.1
      end
    end

    # One request per connection, as a load balancer without keep-alive sends
    # them: a worker being replaced then never holds a client's next request.
    def send_requests(paths)
      started = clock
      paths.each do |path|
        attempts = 0
        begin
          attempts += 1
          # No silent retries: Net::HTTP's own are off, and ours are counted.
          response = Net::HTTP.start("127.0.0.1", @port, max_retries: 0) { |http| http.get(path) }
        rescue EOFError, Errno::ECONNRESET
          # Puma closes a just-accepted connection when the worker that
          # accepted it shuts down (see docs/SERVERS.md): a client retries.
          raise Error, "demo request #{path} failed: the server closed the connection twice" if attempts > 1

          @retried += 1
          retry
        end
        raise Error, "demo request #{path} failed: HTTP #{response.code}" unless response.code == "200"
      end
      clock - started
    end

    def recycle(pid)
      before = worker_pids(pid)
      @out.puts "", "Each /leak request keeps 2 MB; Memkit::MemoryLimit replaces a worker past #{MAX_USS} USS " \
                      "(each worker draws its own limit up to 10% lower, so they are not all replaced at once)."
      send_requests(Array.new(150) { |i| "/leak/#{i}" })
      deadline = clock + 10
      sleep 0.2 until worker_pids(pid).size >= @workers || clock > deadline
      lines = File.readlines(@log).grep(/\Amemkit: worker/)
      @out.puts "  #{lines.first.strip}" if lines.first
      retried = ""
      retried = " (#{@retried} retried on a new connection after the server closed one unanswered)" if @retried.positive?
      @out.puts "  150 requests, none failed#{retried}; #{lines.size} workers replaced " \
                "(#{(before - worker_pids(pid)).size} of the original #{before.size} are gone)."
    end

    # After more requests, so the workers that replaced the bloated ones
    # have learned what a request allocates.
    # /metrics answers for one worker: asked by several clients at once, and
    # again, more of the workers answer.
    # One scrape of /metrics holds every worker's counters (Metrics::Recorder
    # writes a record per worker index, at most once a second). Counted
    # between two scrapes, after each worker's first requests: OobGC leaves
    # a new worker's first GCs to Ruby, which sizes the heap from them.
    def oob_gc
      send_requests(Array.new(@workers * 25) { |i| "/products/#{i * 43}" })
      before = oob_counters
      more = @requests * 3
      send_requests(more.times.map { |i| "/products/#{i * 41}" })
      after = oob_counters
      delta = ->(name) { after.sum { |worker, c| c[name] - before.fetch(worker, {}).fetch(name, 0) } }
      @out.puts "", "#{more} more requests. Memkit::OobGC in #{after.size} workers: #{delta.('runs')} GC runs " \
                    "between requests, #{delta.('inside_request_runs')} inside requests."
    end

    # { [worker index, pid] => { "runs" => n, "inside_request_runs" => n } }, summed over GC kinds.
    def oob_counters
      sleep 1.1 # the latest requests' records are written
      send_requests(Array.new(@workers * 4) { |i| "/products/#{i}" })
      text = Net::HTTP.get("127.0.0.1", "/metrics", @port)
      # Keyed by worker index and pid: a replaced worker's successor starts
      # its counts from zero.
      pids = text.scan(/^memkit_process_info\{role="worker",worker="(\d+)",pid="(\d+)"/).to_h
      counters = Hash.new { |h, k| h[k] = Hash.new(0) }
      text.scan(/^memkit_oobgc_(runs|inside_request_runs)_total\{[^}]*worker="(\d+)"[^}]*\} (\S+)/) do |name, worker, v|
        counters[[worker, pids[worker]]][name] += v.to_f.round
      end
      counters
    end

    def worker_pids(pid) = Tree.read(pid).nodes.drop(1).map(&:pid)

    # The server's graceful stop (with QUIT, Puma's master stayed up until
    # the deadline below).
    def stop(pid)
      Process.kill(MemoryLimit::SIGNALS.fetch(@server.to_sym), pid)
      deadline = clock + 15
      sleep 0.05 until Process.waitpid(pid, Process::WNOHANG) || clock > deadline
    rescue Errno::ESRCH, Errno::ECHILD
      nil
    ensure
      # Whatever is left of the process group (a worker still stopping) goes now.
      begin
        Process.kill(:KILL, -pid)
        Process.waitpid(pid)
      rescue Errno::ESRCH, Errno::ECHILD
        nil
      end
    end

    # The demo's default is Unicorn, with Puma as the fallback: name what to
    # install, the way this process was started (a bundle, or plain gems).
    def missing_server_message
      wanted = @explicit ? "the #{@server} gem" : "the unicorn gem (or puma)"
      how = defined?(Bundler) ? "add it to the Gemfile and run `bundle install`" : "`gem install #{@server}`"
      "memkit demo needs #{wanted}: #{how}"
    end

    def gem_available?(name)
      Gem::Specification.find_by_name(name)
      true
    rescue Gem::MissingSpecError
      false
    end

    def clock = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end
end
