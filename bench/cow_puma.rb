# frozen_string_literal: true

# Puma (cluster) config for bench/cow_app.ru. COW_MEMKIT says how the master
# prepares for fork (any combination, joined with "+"; anchors: nakayoshi = the
# nakayoshi_fork gem, puma_old = 4 minor GCs + GC.compact in before_fork):
#   none    nothing        plugin  plugin :memkit
#   hook    before_fork { Memkit.warmup }
#   nofill  before_fork { Memkit.warmup(fill: false) }   fill  before_fork { Memkit.warmup(fill: true) }
#   fork    require "memkit/fork"
#   process_warmup  before_fork { Process.warmup } (Ruby 3.3+, the anchor)
#   app     before_fork { Memkit.warmup(app: CowApp, requests: 8 x "/") }
#   +norelease  with any Memkit.warmup mode: malloc_release: false
$LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
require "memkit"

mode = ENV.fetch("COW_MEMKIT", "none").split("+")
release = !mode.include?("norelease") # "+norelease": Memkit.warmup(malloc_release: false)
workers Integer(ENV.fetch("COW_WORKERS", "4"))
threads 1, 1
bind "tcp://127.0.0.1:#{ENV.fetch('COW_PORT', '9292')}"
preload_app!
rackup File.expand_path("cow_app.ru", __dir__)
worker_timeout 300
require "memkit/fork" if mode.include?("fork")
require "nakayoshi_fork" if mode.include?("nakayoshi") # the anchor gem: minor GCs before every fork
plugin :memkit if mode.include?("plugin")
before_fork { Memkit.warmup(malloc_release: release) } if mode.include?("hook")
before_fork { Memkit.warmup(fill: false, malloc_release: release) } if mode.include?("nofill")
before_fork { Memkit.warmup(fill: true, malloc_release: release) } if mode.include?("fill")
before_fork { Memkit.warmup(fill: :malloc, malloc_release: release) } if mode.include?("mfill")
before_fork { Process.warmup } if mode.include?("process_warmup")
before_fork { Memkit.warmup(app: CowApp, requests: Array.new(8) { "/" }, malloc_release: release) } if mode.include?("app")
if mode.include?("puma_old") # what Puma's nakayoshi_fork option did before it was removed
  before_fork do
    4.times { GC.start(full_mark: false) }
    GC.compact if GC.respond_to?(:compact)
  end
end
