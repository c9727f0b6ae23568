# frozen_string_literal: true

require_relative "../memkit"
require_relative "warmup"

module Memkit
  # `require "memkit/fork"`: every fork prepares the heap first.
  #
  # Ruby 3.1 added Process._fork, the one method that Kernel#fork,
  # Process.fork, Kernel.fork and IO.popen("-") all call, documented as the
  # place for monitoring libraries to hook; memkit prepends to it, and to
  # Process.daemon, which reaches libc's daemon(3) without it. The work is
  # Memkit::Warmup.run, which is a no-op while the heap has not changed since
  # the last run (a server's own before_fork hook, or the previous fork).
  #
  # Opt out for one call with fork(cow_friendly: false) or
  # fork(nakayoshi: false) (the nakayoshi_fork gem's spelling), on Kernel#fork,
  # Kernel.fork and Process.fork; for popen/daemon, Memkit::Fork.without { }.
  module Fork
    SKIP = :__memkit_fork_skip

    @last_report = nil
    @warned = false

    class << self
      # The Warmup::Report of the most recent fork in this process (a child
      # inherits its parent's), or nil.
      attr_reader :last_report

      # Runs the block with the fork hook switched off for this thread.
      def without
        previous = Thread.current[SKIP]
        Thread.current[SKIP] = true
        yield
      ensure
        Thread.current[SKIP] = previous
      end

      def skipping? = Thread.current[SKIP] ? true : false

      # Called by the _fork hook in the parent. A failure to prepare must
      # never make fork itself fail: it is reported once on stderr instead.
      def before_fork
        return if skipping?

        @last_report = Warmup.run
      rescue StandardError => e
        unless @warned
          @warned = true
          warn "memkit/fork: heap warmup before fork failed, forking anyway: #{e.class}: #{e.message}"
        end
      end

      # In the child: a fork(cow_friendly: false) { ... } block must not pass
      # its opt-out on to the forks its own code makes.
      def after_fork_in_child
        Thread.current[SKIP] = nil
      end
    end

    # Prepended to Process's singleton class.
    module Hook
      def _fork
        Memkit::Fork.before_fork
        pid = super
        Memkit::Fork.after_fork_in_child if pid.zero?
        pid
      end
    end

    # Process.daemon does not call Process._fork where libc has daemon(3)
    # (Ruby 3.1-3.3 on Linux call it directly), so it is prepared here too;
    # where it does go through _fork the second call finds nothing changed.
    module Daemon
      def daemon(*args, **kwargs)
        Memkit::Fork.before_fork
        super
      end
    end

    # fork(cow_friendly: false) / fork(nakayoshi: false); other arguments are
    # passed on untouched so errors stay Ruby's own.
    module Options
      def fork(*args, cow_friendly: true, nakayoshi: true, &block)
        return super(*args, &block) if cow_friendly && nakayoshi

        Memkit::Fork.without { super(*args, &block) }
      end
    end

    # Kernel#fork is private; a prepended public method would make it public.
    module KernelOptions
      include Options
      private :fork
    end

    unless Process.respond_to?(:_fork)
      raise Unsupported, "memkit/fork needs Process._fork (Ruby 3.1+); call Memkit.warmup before fork instead"
    end

    Process.singleton_class.prepend(Hook)
    Process.singleton_class.prepend(Daemon)
    Process.singleton_class.prepend(Options)
    Kernel.singleton_class.prepend(Options)
    Kernel.prepend(KernelOptions)
  end
end
