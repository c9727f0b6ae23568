# frozen_string_literal: true

require "minitest/autorun"
require "rbconfig"
require "socket"
require "timeout"
require "tmpdir"
require "open3"
require "memkit"
require "memkit/loopback"

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
    def free_port = Memkit::Loopback.free_port

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

    # Runs the calling test alone in a new Ruby process and asserts it passed
    # there. For tests whose subject is the GC: the heap this process has
    # grown by earlier tests (in random order) changes when Ruby collects.
    def in_fresh_process
      return yield if ENV["MEMKIT_FRESH_PROCESS"] == name

      file = caller_locations(1, 1).first.path
      out, status = Open3.capture2e({ "MEMKIT_FRESH_PROCESS" => name }, RbConfig.ruby, "-I#{ROOT}/lib",
                                    "-I#{ROOT}/test", file, "-n", name)
      assert status.success? && out.include?("1 runs"), "#{name} in a fresh process:\n#{out}"
      skip "#{name} skipped in a fresh process (run it alone with -v for why)" if out.include?("1 skips")
    end

    def linux?
      File.exist?("/proc/self/smaps_rollup")
    end

    # A test that warms the heap in this process starts MallocRelease, whose
    # thread trims at any moment and starts again in every child forked
    # here: later tests that measure memory would measure it too.
    def after_teardown
      Memkit::MallocRelease.stop if Memkit::MallocRelease.started?
      super
    end
  end
end

Minitest::Test.include(Memkit::TestHelpers)
