# frozen_string_literal: true

require "rbconfig"
require "support/servers"

module Memkit
  # Boots a real Pitchfork (from RubyGems) on 127.0.0.1, like
  # ServersHelper.start_server does for Unicorn and Puma: same Server struct,
  # same stop_server (QUIT to the monitor, which Pitchfork treats as graceful).
  module PitchforkServer
    include ServersHelper

    module_function

    def start_pitchfork(app_source, dir:, port:, workers: 2, env: {}, check_path: "/", extra: "")
      File.write(File.join(dir, "config.ru"), app_source)
      conf = File.join(dir, "pitchfork.conf.rb")
      File.write(conf, <<~RUBY)
        worker_processes #{workers}
        listen "127.0.0.1:#{port}", backlog: 1024
        timeout 60
        #{extra}
      RUBY
      log = File.join(dir, "pitchfork.log")
      bin = Gem.bin_path("pitchfork", "pitchfork")
      pid = Process.spawn(env, RbConfig.ruby, "-I", ServersHelper::LIB, bin, "-c", conf, File.join(dir, "config.ru"),
                          chdir: dir, out: [log, "a"], err: [:child, :out], pgroup: true)
      # :unicorn: stop_server sends QUIT, Pitchfork's graceful stop too.
      server = ServersHelper::Server.new(kind: :unicorn, pid: pid, port: port, log: log, dir: dir)
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 60
      until ServersHelper.answering?(port, check_path)
        raise "pitchfork exited during boot:\n#{server.log_text}" if Process.waitpid(pid, Process::WNOHANG)
        if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
          raise "pitchfork did not answer within 60s:\n#{server.log_text}"
        end

        sleep 0.1
      end
      server
    end
  end
end
