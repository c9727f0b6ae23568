# frozen_string_literal: true

# Unicorn config for bench/cow_app.ru. COW_MEMKIT says how the master
# prepares for fork (any combination, joined with "+"; anchors: nakayoshi = the
# nakayoshi_fork gem, puma_old = 4 minor GCs + GC.compact in before_fork):
#   none  nothing       hook  before_fork { Memkit.warmup }
#   nofill  before_fork { Memkit.warmup(fill: false) }   fill  before_fork { Memkit.warmup(fill: true) }
#   mfill  before_fork { Memkit.warmup(fill: :malloc) }   fork  require "memkit/fork"
#   process_warmup  before_fork { Process.warmup } (Ruby 3.3+, the anchor)
#   app   before_fork { Memkit.warmup(app: CowApp, requests: 8 x "/") }
#   +norelease  with any Memkit.warmup mode: malloc_release: false
$LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
require "memkit"

mode = ENV.fetch("COW_MEMKIT", "none").split("+")
release = !mode.include?("norelease") # "+norelease": Memkit.warmup(malloc_release: false)
worker_processes Integer(ENV.fetch("COW_WORKERS", "4"))
listen "127.0.0.1:#{ENV.fetch('COW_PORT', '8080')}"
preload_app true
timeout 300
require "memkit/fork" if mode.include?("fork")
require "nakayoshi_fork" if mode.include?("nakayoshi") # the anchor gem: minor GCs before every fork

before_fork do |_server, _worker|
  if mode.include?("puma_old")
    4.times { GC.start(full_mark: false) } # Puma's old nakayoshi_fork option
    GC.compact if GC.respond_to?(:compact)
  elsif mode.include?("process_warmup")
    Process.warmup # the anchor on Ruby 3.3+
  elsif mode.include?("mfill")
    Memkit.warmup(fill: :malloc, malloc_release: release)
  elsif mode.include?("fill")
    Memkit.warmup(fill: true, malloc_release: release)
  elsif mode.include?("nofill")
    Memkit.warmup(fill: false, malloc_release: release)
  elsif mode.include?("app")
    Memkit.warmup(app: CowApp, requests: Array.new(8) { "/" }, malloc_release: release) # app warm-up, then the heap steps
  elsif mode.include?("hook")
    Memkit.warmup(malloc_release: release)
  end
end
