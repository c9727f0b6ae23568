# frozen_string_literal: true

require "net/http"
require "rbconfig"
require "socket"
require "tmpdir"

module Memkit
  # Boots the sample app on a real Unicorn (or Puma) with several workers on
  # 127.0.0.1, sends it requests, and reports the server's memory.
  class Demo
    APP = File.expand_path("demo/config.ru", __dir__)

    def initialize(workers: 4, requests: 400, server: nil, out: $stdout)
      @workers = workers
      @requests = requests
      @server = server || (gem_available?("unicorn") ? "unicorn" : "puma")
      @out = out
      raise InvalidArgument, "server: #{@server.inspect} (unicorn or puma)" unless %w[unicorn puma].include?(@server)
      raise Error, "memkit demo needs the #{@server} gem: run `bundle install` first" unless gem_available?(@server)
    end

    # Yields the master pid once all workers are up and the requests are done.
    def run
      Dir.mktmpdir("memkit-demo") do |dir|
        port = free_port
        log = File.join(dir, "server.log")
        @out.puts "Booting #{@server} with #{@workers} workers on 127.0.0.1:#{port} (log: #{log})"
        pid = Process.spawn(RbConfig.ruby, *command(dir, port), out: log, err: log, pgroup: true)
        begin
          wait_for_workers(pid, port, log)
          elapsed = send_requests(port)
          @out.puts format("Sent %d requests in %.1fs.", @requests, elapsed), ""
          yield pid
        ensure
          stop(pid)
        end
      end
    end

    private

    def command(dir, port)
      if @server == "unicorn"
        config = File.join(dir, "unicorn.rb")
        File.write(config, <<~RUBY)
          worker_processes #{@workers}
          listen "127.0.0.1:#{port}"
          preload_app true
          pid #{File.join(dir, 'unicorn.pid').inspect}
        RUBY
        [Gem.bin_path("unicorn", "unicorn"), "-c", config, APP]
      else
        [Gem.bin_path("puma", "puma"), "-w", @workers.to_s, "--preload", "-t", "1:4",
         "-b", "tcp://127.0.0.1:#{port}", APP]
      end
    end

    def wait_for_workers(pid, port, log)
      deadline = clock + 60
      until Tree.read(pid).nodes.size > @workers && listening?(port)
        if Process.waitpid(pid, Process::WNOHANG) || clock > deadline
          raise Error, "#{@server} did not start: #{File.read(log).lines.last(5).join.strip}"
        end

        sleep 0.1
      end
    end

    def send_requests(port)
      started = clock
      Net::HTTP.start("127.0.0.1", port) do |http|
        @requests.times do |i|
          response = http.get("/products/#{i * 37}")
          raise Error, "demo request #{i} failed: HTTP #{response.code}" unless response.code == "200"
        end
      end
      clock - started
    end

    def stop(pid)
      Process.kill(:QUIT, pid)
      deadline = clock + 15
      sleep 0.05 until Process.waitpid(pid, Process::WNOHANG) || clock > deadline
    rescue Errno::ESRCH, Errno::ECHILD
      nil
    ensure
      # Whatever is left of the process group (a worker that ignored QUIT) goes now.
      begin
        Process.kill(:KILL, -pid)
        Process.waitpid(pid)
      rescue Errno::ESRCH, Errno::ECHILD
        nil
      end
    end

    def listening?(port)
      TCPSocket.new("127.0.0.1", port).close
      true
    rescue SystemCallError
      false
    end

    def free_port
      server = TCPServer.new("127.0.0.1", 0)
      server.addr[1]
    ensure
      server&.close
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
