# frozen_string_literal: true

# How the master prepares for fork, shared by unicorn.rb and puma.rb.
module BenchRails
  module Modes
    module_function

    def parse(spec)
      name, *flags = spec.split("+")
      { name: name, fill: (true if flags.include?("fill")) || (false if flags.include?("nofill")) }
    end

    def at_config(mode)
      case mode[:name]
      when "nakayoshi" then require "nakayoshi_fork"
      when "fork" then require "memkit/fork"
      when "plain", "process_warmup", "memkit", "heap" then nil
      else raise ArgumentError, "unknown COW_MEMKIT #{mode[:name].inspect}"
      end
      require "memkit"
    end

    def before_fork(mode)
      Memkit::Railtie.disconnect_database # the database rule, whatever the mode
      options = mode[:fill].nil? ? {} : { fill: mode[:fill] }
      case mode[:name]
      when "process_warmup" then Process.warmup
      when "memkit"
        # Closes the database connections, warms the app with
        # config.memkit.warmup_requests, prepares the heap, closes them again.
        report = Memkit::Railtie.before_fork(**options)
        warn "memkit warmup: #{report.requests.size} requests, #{report.failures.size} failed" unless report.requests.empty?
      when "heap" then Memkit.warmup(**options)
      end
    end
  end
end
