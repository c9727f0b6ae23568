# frozen_string_literal: true

require "json"

module Memkit
  class Doctor
    # Runs the probe (doctor/probe.rb) in a child process and returns what it
    # printed, parsed, or { skipped: "why" }.
    #
    # The deadline is real: the probe runs in its own process group, its
    # output is read with IO.select until `timeout` seconds have passed, and
    # then the whole group (the probe forks a child of its own) is killed
    # and reaped. No threads are started, so a timed-out run leaves nothing
    # behind, prints nothing, and adds no thread to the process doctor is
    # examining when that process is memkit itself.
    class ProbeRunner
      SCRIPT = File.expand_path("probe.rb", __dir__)
      CHUNK = 65_536

      # ruby: the Ruby binary to run it with; env: the probe's whole
      # environment; args: its arguments; script: the program to run.
      def initialize(ruby:, env:, args:, timeout:, script: SCRIPT)
        @ruby = ruby
        @env = env
        @args = args.map(&:to_s)
        @timeout = timeout
        @script = script
        raise InvalidArgument, "Doctor timeout: expected a positive number, got #{timeout.inspect}" unless
          timeout.is_a?(Numeric) && timeout.positive?
      end

      def call
        out, err, status = capture
        unless status
          return { skipped: "the probe did not finish within #{@timeout}s and was stopped", timed_out: true }
        end
        return { skipped: "the probe failed: #{err.lines.last.to_s.strip}" } unless status.success?

        JSON.parse(out, symbolize_names: true)
      rescue JSON::ParserError, SystemCallError => e
        { skipped: "the probe failed: #{e.message}" }
      end

      private

      # [stdout, stderr, Process::Status], or a nil status when the deadline passed.
      def capture
        deadline = now + @timeout
        out_r, out_w = IO.pipe
        err_r, err_w = IO.pipe
        begin
          pid = Process.spawn(@env, @ruby, "--disable-gems", @script, *@args,
                              unsetenv_others: true, pgroup: true, in: File::NULL, out: out_w, err: err_w)
        ensure
          out_w.close
          err_w.close
        end
        buffers = { out_r => +"", err_r => +"" }
        read_until(deadline, buffers)
        status = wait_until(deadline, pid)
        [buffers[out_r], buffers[err_r], status]
      ensure
        stop(pid) if pid && status.nil?
        out_r&.close
        err_r&.close
      end

      def read_until(deadline, buffers)
        open = buffers.keys
        until open.empty?
          left = deadline - now
          return if left <= 0

          ready, = IO.select(open, nil, nil, left)
          ready&.each do |io|
            chunk = io.read_nonblock(CHUNK, exception: false)
            if chunk.nil?
              open.delete(io)
            elsif chunk != :wait_readable
              buffers[io] << chunk
            end
          end
        end
      end

      # The probe closed its output; it may still be exiting.
      def wait_until(deadline, pid)
        loop do
          _, status = Process.wait2(pid, Process::WNOHANG)
          return status if status
          return nil if now >= deadline

          sleep 0.01
        end
      end

      def stop(pid)
        Process.kill(:KILL, -pid)
      rescue Errno::ESRCH, Errno::EPERM
        nil # already gone
      ensure
        begin
          Process.wait(pid)
        rescue Errno::ECHILD
          nil
        end
      end

      def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end
  end
end
