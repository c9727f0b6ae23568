# frozen_string_literal: true

# How the master prepares for fork, shared by unicorn.rb and puma.rb.
module BenchRails
  module Modes
    module_function

    def parse(spec)
      name, *flags = spec.split("+")
      unknown = flags - %w[fill nofill mfill refork count norelease nopreload]
      raise ArgumentError, "unknown COW_MEMKIT flag #{unknown.first.inspect} in #{spec.inspect}" if unknown.any?

      # refork: Puma's fork_worker, reforked when memkit's policy says so
      # (Memkit::Refork::PumaWatcher); count: fork_worker 1000, Puma's own
      # request count. Puma only.
      refork = (:memkit if flags.include?("refork")) || (:count if flags.include?("count"))
      fill = if flags.include?("mfill") then :malloc # the malloc holes only
             elsif flags.include?("fill") then true
             elsif flags.include?("nofill") then false
             end
      # norelease: Memkit.warmup(malloc_release: false); nopreload: Puma
      # without preload_app!, as Puma documents fork_worker (worker 0 loads
      # the app, the master never does)
      { name: name, fill: fill, refork: refork, release: !flags.include?("norelease"),
        preload: !flags.include?("nopreload") }
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
      options[:malloc_release] = false unless mode[:release]
      case mode[:name]
      when "process_warmup" then Process.warmup
      when "memkit"
        # Closes the database connections, warms the app with
        # config.memkit.warmup_requests, prepares the heap, closes them again.
        report = Memkit::Railtie.before_fork(**options)
        unless report.requests.empty?
          warn "memkit warmup: #{report.requests.size} requests, #{report.failures.size} failed"
        end
      when "heap" then Memkit.warmup(**options)
      end
    end

    # In Puma's worker 0 before it forks the workers again: the same
    # preparation as before the first fork (the app's warm-up requests ran
    # in the master already and are not sent again).
    def before_refork(mode)
      before_fork(mode)
    end
  end
end
