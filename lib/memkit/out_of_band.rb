# frozen_string_literal: true

module Memkit
  # One hand-off from Puma's out_of_band hook to whatever in memkit wants to
  # run while the worker is idle and accepts nothing (OobGC's collection,
  # MemoryLimit's replacement). `plugin :memkit` calls OutOfBand.run from
  # that hook; a config/puma.rb without the plugin can do the same:
  #
  #   out_of_band { Memkit::OutOfBand.run }
  #
  # Handlers are registered by name (registering a name again replaces its
  # handler, so reloading code does not pile them up) and run in `order`,
  # lowest first. A handler that returns :stop ends the run: the worker is
  # going away, and collecting garbage in it would only delay that.
  module OutOfBand
    @lock = Mutex.new
    @handlers = {} # name => [order, callable]
    @hook_pid = nil
    @installed = false

    class << self
      def register(name, order: 50, &handler)
        raise ArgumentError, "Memkit::OutOfBand.register(#{name.inspect}) needs a block" unless handler

        @lock.synchronize { @handlers[name] = [order, handler] }
        name
      end

      def unregister(name)
        @lock.synchronize { !@handlers.delete(name).nil? }
      end

      def registered?(name)
        @lock.synchronize { @handlers.key?(name) }
      end

      # Called from the server's hook. Returns the names of the handlers
      # that ran. Handlers run outside the lock, so they may register others.
      def run
        handlers = @lock.synchronize do
          @hook_pid = Process.pid
          @handlers.sort_by { |_, (order, _)| order }.map { |name, (_, handler)| [name, handler] }
        end
        ran = []
        handlers.each do |name, handler|
          ran << name
          break if handler.call == :stop
        end
        ran
      end

      # `plugin :memkit` says so when Puma loads its config, in the master:
      # every worker it forks will run the hook, so OobGC need not wait for
      # the hook's first run to know (OobGC#check_hook).
      def installed! = (@installed = true)
      def installed? = @installed

      # Whether the server's hook has run in this process (a forked worker
      # starts with false: the pid the hook ran in is the parent's).
      def hooked?
        @lock.synchronize { @hook_pid == Process.pid }
      end
    end
  end
end
