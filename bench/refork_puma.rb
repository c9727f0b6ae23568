# frozen_string_literal: true

# Puma config for bench/refork.rb: 4 workers with fork_worker (worker 0 forks
# the other three) serving bench/refork_app.ru. Every mode prepares the heap
# with Memkit.warmup before the first fork and before each refork; they
# differ only in what decides a refork (REFORK_MODE):
#   none    fork_worker 0: never
#   count   fork_worker 1000: Puma's default, once worker 0 has served 1000 requests
#   memkit  fork_worker 0 + plugin :memkit: Memkit::Refork::PumaWatcher's policy
$LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
require "memkit"

mode = ENV.fetch("REFORK_MODE")
workers Integer(ENV.fetch("REFORK_WORKERS", "4"))
threads 1, 1
bind "tcp://127.0.0.1:#{ENV.fetch('REFORK_PORT')}"
preload_app!
# REFORK_APP: refork_app.ru (first-use caches and code that every worker
# fills the same way) or cow_app.ru (the same app without them).
rackup File.expand_path(ENV.fetch("REFORK_APP", "refork_app.ru"), __dir__)
worker_timeout 300
case mode
when "none", "count"
  fork_worker(mode == "count" ? 1000 : 0)
  before_fork { Memkit.warmup }
  before_refork { Memkit.warmup }
when "memkit"
  fork_worker 0
  plugin :memkit
else raise ArgumentError, "REFORK_MODE: none, count or memkit, not #{mode.inspect}"
end
