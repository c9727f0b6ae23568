# frozen_string_literal: true

# Unicorn config for the bench Rails app (bench/cow_rails.rb). COW_MEMKIT:
#   plain        nothing before fork
#   nakayoshi    the nakayoshi_fork gem (minor GCs before every fork; the 3.1/3.2 anchor)
#   process_warmup  Process.warmup in before_fork (the 3.3+ anchor)
#   memkit       Memkit.warmup(app:, requests:) in before_fork: the app's requests, then the heap
#   heap         Memkit.warmup in before_fork: the heap steps only, no requests
#   fork         require "memkit/fork" (the heap steps on every fork, no requests)
# "+fill" / "+nofill" after a memkit mode passes fill: true / false.
require_relative "modes"

mode = BenchRails::Modes.parse(ENV.fetch("COW_MEMKIT", "plain"))
raise ArgumentError, "COW_MEMKIT #{ENV['COW_MEMKIT']}: Unicorn does not refork" if mode[:refork]
worker_processes Integer(ENV.fetch("COW_WORKERS", "4"))
listen "127.0.0.1:#{ENV.fetch('COW_PORT', '8080')}"
preload_app true
timeout 300
BenchRails::Modes.at_config(mode)

before_fork do |_server, _worker|
  BenchRails::Modes.before_fork(mode)
end
