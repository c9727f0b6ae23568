# frozen_string_literal: true

require "rbconfig"
require_relative "servers"

module Memkit
  # Boots a real Pitchfork server on 127.0.0.1 for tests and benchmarks, with
  # the same Server struct and stop_server as ServersHelper.
  module PitchforkHelper
    include ServersHelper

    module_function

    # Writes config.ru and pitchfork.conf.rb (`config` is appended to a base of
    # workers, listener and log) into dir, starts Pitchfork, and waits until it answers.
    def start_pitchfork(app_source, dir:, port:, workers: 2, config: "", env: {})
      File.write(File.join(dir, "config.ru"), app_source)
      conf = File.join(dir, "pitchfork.conf.rb")
      File.write(conf, <<~RUBY)
        worker_processes #{workers}
        listen "127.0.0.1:#{port}", backlog: 1024
        timeout 60
        #{config}
      RUBY
      log = File.join(dir, "pitchfork.log")
      argv = [Gem.bin_path("pitchfork", "pitchfork"), "-c", conf, File.join(dir, "config.ru")]
      pid = Process.spawn(env, RbConfig.ruby, "-I", ServersHelper::LIB, *argv, chdir: dir, out: [log, "a"],
                                                                                 err: [:child, :out], pgroup: true)
      server = ServersHelper::Server.new(kind: :pitchfork, pid: pid, port: port, log: log, dir: dir)
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 60
      until ServersHelper.answering?(port, "/")
        raise "pitchfork exited during boot:\n#{server.log_text}" if Process.waitpid(pid, Process::WNOHANG)
        raise "pitchfork did not answer within 60s:\n#{server.log_text}" if
          Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

        sleep 0.1
      end
      server
    end
  end
end
