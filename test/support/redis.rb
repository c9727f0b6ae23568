# frozen_string_literal: true

require "tmpdir"
require "timeout"

module Memkit
  # Starts a real redis-server (Debian's) on a Unix socket in a directory of
  # the caller's, with nothing saved to disk, and stops it.
  module RedisHelper
    module_function

    # Path of redis-server, or nil when it is not installed.
    def redis_server_path
      ENV.fetch("PATH", "").split(File::PATH_SEPARATOR).map { |d| File.join(d, "redis-server") }
         .find { |f| File.executable?(f) } || (File.executable?("/usr/bin/redis-server") ? "/usr/bin/redis-server" : nil)
    end

    # Yields the socket path; the server is stopped (and reaped) afterwards.
    def with_redis(dir)
      bin = redis_server_path or raise "redis-server is not installed (apt-get install redis-server)"
      sock = File.join(dir, "redis.sock")
      log = File.join(dir, "redis.log")
      pid = Process.spawn(bin, "--port", "0", "--unixsocket", sock, "--unixsocketperm", "700", "--save", "",
                          "--appendonly", "no", "--dir", dir, out: log, err: [:child, :out])
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 20
      until File.socket?(sock) && ping(sock)
        raise "redis-server exited:\n#{File.read(log)}" if Process.waitpid(pid, Process::WNOHANG)
        raise "redis-server did not start within 20s:\n#{File.read(log)}" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

        sleep 0.05
      end
      yield sock
    ensure
      if pid
        begin
          Process.kill(:TERM, pid)
          Timeout.timeout(10) { Process.waitpid(pid) }
        rescue Errno::ESRCH, Errno::ECHILD
          nil
        rescue Timeout::Error
          Process.kill(:KILL, pid)
          Process.waitpid(pid)
        end
      end
    end

    def ping(sock)
      UNIXSocket.open(sock) do |s|
        s.write("PING\r\n")
        s.wait_readable(1) && s.readpartial(64).start_with?("+PONG")
      end
    rescue SystemCallError, IOError
      false
    end
  end
end
