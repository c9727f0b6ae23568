# frozen_string_literal: true

require "socket"
require "rbconfig"
require "tmpdir"
require_relative "../../lib/memkit" # MemoryLimit::SIGNALS: each server's graceful stop

module Memkit
  # Boots real Unicorn and Puma (cluster) servers on 127.0.0.1 for tests and
  # benchmarks, and a keep-alive HTTP client that tells apart the two ways a
  # keep-alive request can end without a response.
  module ServersHelper
    LIB = File.expand_path("../../lib", __dir__)

    # A running server: master pid, port, and its log file.
    Server = Struct.new(:kind, :pid, :port, :log, :dir, keyword_init: true) do
      def log_text = File.exist?(log) ? File.read(log) : ""
    end

    module_function

    # Writes config.ru (the given source) and a server config into dir, starts
    # the server, and waits until it answers. kind: :unicorn or :puma.
    def start_server(kind, app_source, dir:, port:, workers: 2, threads: 1, env: {}, check_path: "/", extra: "")
      File.write(File.join(dir, "config.ru"), app_source)
      log = File.join(dir, "#{kind}.log")
      argv =
        case kind
        when :unicorn
          File.write(File.join(dir, "unicorn.conf.rb"), <<~RUBY)
            worker_processes #{workers}
            listen "127.0.0.1:#{port}", backlog: 1024
            preload_app true
            timeout 60
            working_directory #{dir.inspect}
            #{extra}
          RUBY
          [Gem.bin_path("unicorn", "unicorn"), "-c", File.join(dir, "unicorn.conf.rb"), File.join(dir, "config.ru")]
        when :puma
          File.write(File.join(dir, "puma.rb"), <<~RUBY)
            workers #{workers}
            threads #{threads}, #{threads}
            bind "tcp://127.0.0.1:#{port}"
            preload_app!
            rackup #{File.join(dir, 'config.ru').inspect}
            directory #{dir.inspect}
            # Replaced workers are noticed at the master's next check.
            worker_check_interval 1
            worker_shutdown_timeout 20
            environment "production"
            log_requests false
            #{extra}
          RUBY
          [Gem.bin_path("puma", "puma"), "-C", File.join(dir, "puma.rb")]
        else raise ArgumentError, "unknown server #{kind}"
        end
      # Append mode: master and workers write to one file without overwriting.
      pid = Process.spawn(env, RbConfig.ruby, "-I", LIB, *argv, chdir: dir, out: [log, "a"], err: [:child, :out], pgroup: true)
      server = Server.new(kind: kind, pid: pid, port: port, log: log, dir: dir)
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 60
      until answering?(port, check_path)
        if Process.waitpid(pid, Process::WNOHANG)
          raise "#{kind} exited during boot:\n#{server.log_text}"
        end
        raise "#{kind} did not answer within 60s:\n#{server.log_text}" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

        sleep 0.1
      end
      server
    end

    # Graceful stop, then SIGKILL to the whole process group after `grace` s.
    def stop_server(server, grace: 15)
      return unless server&.pid

      Process.kill(MemoryLimit::SIGNALS.fetch(server.kind), server.pid)
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + grace
      until Process.waitpid(server.pid, Process::WNOHANG)
        if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
          Process.kill(:KILL, -server.pid)
          Process.waitpid(server.pid)
          break
        end
        sleep 0.05
      end
      # Workers can outlive their master while they run their at_exit (a
      # Puma master does not always wait for them): killed right after the
      # master, a worker's figures for a benchmark were lost.
      sleep 0.05 while group_alive?(server.pid) && Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
    rescue Errno::ESRCH, Errno::ECHILD
      nil
    ensure
      begin
        Process.kill(:KILL, -server.pid) # workers left behind, if any
      rescue Errno::ESRCH, Errno::EPERM
        nil
      end
    end

    # Whether a process of the process group `pgid` is still there.
    def group_alive?(pgid)
      Process.kill(0, -pgid)
      true
    rescue Errno::ESRCH
      false
    end

    def answering?(port, path)
      client = KeepAliveClient.new(port)
      client.get(path)[0] == 200
    rescue SystemCallError, IOError, KeepAliveClient::Failure
      false
    ensure
      client&.close
    end

    # Minimal HTTP/1.1 client that keeps its connection open between requests.
    #
    # RFC 9112 section 9.3.1: a server may close an idle keep-alive connection
    # at any time, and a client may then retry an idempotent request on a new
    # connection. Before each reuse this client checks whether the server has
    # closed the connection (stale_reconnects); if the close races with the
    # request, so that nothing at all comes back, it retries once on a new
    # connection (retries_after_send on a reused connection, unanswered_fresh
    # on a new one). Anything else -- a status other than 2xx, a partial
    # response, a failed retry -- raises Failure.
    class KeepAliveClient
      class Failure < StandardError; end

      attr_reader :stale_reconnects, :retries_after_send, :unanswered_fresh, :connections

      def initialize(port, timeout: 30)
        @port = port
        @timeout = timeout
        @sock = nil
        @stale_reconnects = 0
        @retries_after_send = 0
        @unanswered_fresh = 0
        @connections = 0
      end

      # [status, headers, body]
      def get(path)
        reused = ensure_connection
        begin
          response = roundtrip(path)
        rescue EOFError, Errno::ECONNRESET, Errno::EPIPE => e
          close
          raise Failure, "GET #{path}: #{e.class} after part of a response" if @got_bytes

          # Nothing came back: the server closed the connection without reading
          # the request -- an idle keep-alive connection, or (Puma, when a worker
          # shuts down) one accepted whose request had not arrived yet. Both
          # are safe to retry for a GET (RFC 9110 section 9.2.2), as Net::HTTP
          # does; they are counted apart.
          reused ? @retries_after_send += 1 : @unanswered_fresh += 1
          ensure_connection
          begin
            response = roundtrip(path)
          rescue EOFError, SystemCallError, IOError => e2
            close
            raise Failure, "GET #{path}: #{e.class}, then the retry on a new connection failed: #{e2.class}: #{e2.message}"
          end
        end
        status, headers, _body = response
        close if headers["connection"]&.casecmp?("close")
        raise Failure, "GET #{path}: status #{status}" unless (200..299).cover?(status)

        response
      end

      def close
        @sock&.close
      rescue IOError
        nil
      ensure
        @sock = nil
      end

      private

      # true when an open connection is being reused.
      def ensure_connection
        if @sock && stale?
          close
          @stale_reconnects += 1
        end
        return true if @sock

        @sock = Socket.tcp("127.0.0.1", @port, connect_timeout: @timeout)
        @sock.setsockopt(Socket::IPPROTO_TCP, Socket::TCP_NODELAY, 1)
        @connections += 1
        false
      end

      # The server closed (or reset) an idle connection: it is readable and
      # reading gives EOF.
      def stale?
        return false unless @sock.wait_readable(0)

        @sock.read_nonblock(1, exception: false) != :wait_readable
      rescue SystemCallError, IOError
        true
      end

      def roundtrip(path)
        @got_bytes = false
        @sock.write("GET #{path} HTTP/1.1\r\nHost: 127.0.0.1:#{@port}\r\nConnection: keep-alive\r\n\r\n")
        status_line = read_line
        status = status_line[/\AHTTP\/1\.[01] (\d{3})/, 1]&.to_i or raise Failure, "bad status line #{status_line.inspect}"
        headers = {}
        while (line = read_line) != ""
          k, v = line.split(":", 2)
          headers[k.downcase] = v.to_s.strip
        end
        body =
          if (len = headers["content-length"])
            read_exactly(len.to_i)
          elsif headers["transfer-encoding"]&.include?("chunked")
            read_chunked
          else
            read_to_eof
          end
        [status, headers, body]
      end

      def read_line
        line = +""
        until line.end_with?("\r\n")
          c = read_some(1)
          line << c
        end
        line.chomp("\r\n")
      end

      def read_exactly(n)
        buf = +""
        buf << read_some(n - buf.bytesize) while buf.bytesize < n
        buf
      end

      def read_chunked
        body = +""
        loop do
          size = read_line.to_i(16)
          break read_line if size.zero?

          body << read_exactly(size)
          read_line
        end
        body
      end

      def read_to_eof
        body = +""
        loop { body << read_some(65_536) }
      rescue EOFError
        close
        body
      end

      def read_some(n)
        raise Failure, "timed out after #{@timeout}s waiting for a response" unless @sock.wait_readable(@timeout)

        data = @sock.readpartial(n)
        @got_bytes = true
        data
      rescue EOFError, Errno::ECONNRESET
        raise Failure, "connection closed in the middle of a response" if @got_bytes

        raise
      end
    end
  end
end
