# frozen_string_literal: true

# Puma (cluster) config for the bench Rails app; COW_MEMKIT as in unicorn.rb.
require_relative "modes"

mode = BenchRails::Modes.parse(ENV.fetch("COW_MEMKIT", "plain"))
workers Integer(ENV.fetch("COW_WORKERS", "4"))
threads 1, 1
bind "tcp://127.0.0.1:#{ENV.fetch('COW_PORT', '9292')}"
preload_app!
rackup File.expand_path("config.ru", __dir__)
worker_timeout 300
BenchRails::Modes.at_config(mode)

before_fork do
  BenchRails::Modes.before_fork(mode)
end
