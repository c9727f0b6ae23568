# frozen_string_literal: true

require "minitest/autorun"
require "rbconfig"
require "socket"
require "timeout"
require "tmpdir"
require "open3"
require "memkit"

module Memkit
  # Helpers for tests that use real processes, real /proc and real servers.
  module TestHelpers
    ROOT = File.expand_path("..", __dir__)
    EXE = File.join(ROOT, "exe", "memkit")

    # Runs `memkit ARGS` in a new Ruby process: [stdout, stderr, status].
    def memkit(*args, **opts)
      Open3.capture3(RbConfig.ruby, EXE, *args.map(&:to_s), **opts)
    end

    # Polls until the block returns truthy, or fails the test after `timeout` s.
    def wait_until(timeout: 10, interval: 0.02, message: "condition")
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
      loop do
        result = yield
        return result if result
        flunk "timed out after #{timeout}s waiting for #{message}" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
        sleep interval
      end
    end

    # A TCP port on 127.0.0.1 that nothing listens on right now.
    def free_port
      server = TCPServer.new("127.0.0.1", 0)
      server.addr[1]
    ensure
      server&.close
    end

    # Forks `count` children that run the optional `child` proc, then sleep
    # until killed; yields their pids and always reaps them.
    def with_children(count, child: nil, &block)
      readers = []
      pids = count.times.map do |i|
        r, w = IO.pipe
        readers << r
        pid = fork do
          r.close
          child&.call(i)
          w.write("ready")
          w.close
          sleep
        end
        w.close
        pid
      end
      readers.each { |r| r.read(5); r.close }
      block.call(pids)
    ensure
      pids&.each { |pid| Process.kill(:KILL, pid) rescue nil }
      pids&.each { |pid| Process.wait(pid) rescue nil }
    end

    def linux?
      File.exist?("/proc/self/smaps_rollup")
    end
  end
end

Minitest::Test.include(Memkit::TestHelpers)
