# frozen_string_literal: true

require_relative "../memkit"

begin
  require "rails/railtie"
rescue LoadError
  raise Memkit::Unsupported, "memkit/railtie needs Rails (railties); without Rails call Memkit.warmup(app:, requests:)"
end

module Memkit
  # Rails set-up for a forking server, in one call from its before_fork hook:
  #
  #   # Gemfile
  #   gem "memkit", require: ["memkit", "memkit/railtie"]
  #   # config/application.rb (or an environment file)
  #   config.memkit.warmup_requests = ["/products", "/api/products.json"]
  #   # config/unicorn.rb (Puma: the same line in before_fork)
  #   before_fork { |_server, _worker| Memkit::Railtie.before_fork }
  #
  # before_fork closes Active Record's connections (no socket or SQLite
  # handle may be shared by two processes), sends the warm-up requests through
  # the Rails app in the master, prepares the heap (Memkit.warmup), and closes
  # the connections the requests opened. Unicorn calls before_fork once per
  # worker: the requests run on the first call only, and the heap steps are
  # skipped while nothing changed.
  class Railtie < ::Rails::Railtie
    config.memkit = ActiveSupport::OrderedOptions.new
    # GET paths (Strings) and Rack envs (Hashes): pages without side effects.
    config.memkit.warmup_requests = []

    class << self
      # Options go to Memkit.warmup (fill:, compact:, ...). Returns its report.
      def before_fork(app: ::Rails.application, requests: app.config.memkit.warmup_requests, logger: ::Rails.logger,
                      **options)
        disconnect_database
        report = if requests.empty?
                   Memkit.warmup(**options)
                 else
                   Memkit.warmup(app: app, requests: requests, logger: logger, **options)
                 end
        disconnect_database
        report
      end

      # Every Active Record pool's connections, closed in this process.
      def disconnect_database
        return unless defined?(::ActiveRecord::Base)

        handler = ::ActiveRecord::Base.connection_handler
        pools = begin
          handler.connection_pool_list(:all)
        rescue ArgumentError
          handler.connection_pool_list # Rails 6.1: no role argument, every pool
        end
        pools.each(&:disconnect!)
      end
    end
  end
end
