# frozen_string_literal: true

# The "malloc" app shape (bench/oobgc_shapes.rb: 8 MB malloc'd and ~3,600
# objects a request) in one process, Ruby alone against Memkit::OobGC: GC
# runs and requests between them, RSS sampled after every request (mean and
# highest), the heap's pages, glibc's top pad, and wall time per request.
# Counted from the 101st request. What a lazy sweep holds shows here: until
# a page is swept, its garbage keeps the malloc'd memory it points at.
#   script/ruby34 bundle exec ruby -Ilib bench/oobgc_malloc_sweep.rb [requests]
require_relative "oobgc_shapes" # SHAPES

def sweep_child(mode, requests)
  SHAPES.fetch("malloc").each { |k, v| ENV[k] = v }
  require "memkit"
  require "memkit/oob_gc"
  require_relative "oobgc_app"
  app = ->(_env) { [200, {}, [OobgcBench.render]] }
  app = Memkit::OobGC.new(app) if mode == "memkit"
  rss = []
  count = gcs = started = nil
  (100 + requests).times do |i|
    if i == 100
      count = GC.count
      gcs = 0
      started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end
    env = { "rack.after_reply" => [] }
    _, _, body = app.call(env)
    body.each { |_| nil }
    env["rack.after_reply"].each(&:call)
    next unless count

    rss << File.read("/proc/self/statm").split[1].to_i * 4096
    gcs += GC.count - count
    count = GC.count
  end
  elapsed = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
  page = GC::INTERNAL_CONSTANTS.fetch(:HEAP_PAGE_SIZE)
  puts JSON.generate(gc: gcs, rss_mean: rss.sum / rss.size, rss_max: rss.max,
                     heap: GC.stat(:heap_eden_pages) * page, pad: mode == "memkit" ? Memkit::OobGC.stats.malloc_pad : 0,
                     ms: 1000 * elapsed / requests)
end

if ARGV[0] == "--child"
  sweep_child(ARGV[1], Integer(ARGV[2]))
  exit
end

requests = Integer(ARGV[0] || 600)
mb = ->(bytes) { format("%.1f", bytes / 1_048_576.0) }
puts "oobgc malloc sweep: #{RUBY_DESCRIPTION}; #{requests} requests counted after the first 100"
rows = %w[none memkit].to_h do |mode|
  out = IO.popen([RbConfig.ruby, "-I#{File.expand_path('../lib', __dir__)}", __FILE__, "--child", mode, requests.to_s],
                 &:read)
  [mode, JSON.parse(out.lines.last)]
end
none = rows.fetch("none")
puts format("%-7s %5s %9s %9s %8s %8s %7s %7s %6s %6s", "mode", "gc", "req/gc", "rss_mean", "rss_max", "heap_MB",
            "pad_MB", "ms/req", "rss_x", "gc_x")
rows.each do |mode, r|
  puts format("%-7s %5d %9.1f %9s %8s %8s %7s %7.2f %6.2f %6.2f", mode, r["gc"], requests.fdiv([r["gc"], 1].max),
              mb.(r["rss_mean"]), mb.(r["rss_max"]), mb.(r["heap"]), mb.(r["pad"]), r["ms"],
              r["rss_mean"].fdiv(none["rss_mean"]), r["gc"].fdiv([none["gc"], 1].max))
end
