# frozen_string_literal: true

# Unicorn config for bench/cow_app.ru. COW_MEMKIT says how the master
# prepares for fork (any combination, joined with "+"):
#   none  nothing       hook  before_fork { Memkit.warmup }
#   fill  before_fork { Memkit.warmup(fill: true) }
#   fork  require "memkit/fork"
$LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
require "memkit"

mode = ENV.fetch("COW_MEMKIT", "none").split("+")
worker_processes Integer(ENV.fetch("COW_WORKERS", "4"))
listen "127.0.0.1:#{ENV.fetch('COW_PORT', '8080')}"
preload_app true
timeout 300
require "memkit/fork" if mode.include?("fork")

before_fork do |_server, _worker|
  if mode.include?("fill")
    Memkit.warmup(fill: true)
  elsif mode.include?("hook")
    Memkit.warmup
  end
end
