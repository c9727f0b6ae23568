# frozen_string_literal: true

# Where GC runs, per app shape, in one process: bench/oobgc_app.rb's request
# served through Memkit::OobGC as a server would (rack.after_reply called
# after the response), against Ruby alone. No server, no load generator:
# GC counts and heap sizes only, not latency (bench/oobgc_matrix.rb has those).
#
#   ruby -Ilib bench/oobgc_shapes.rb [--scale 1.0] [--shapes tiny,medium,...] [--modes none,memkit,...]
#
# Modes: none (Ruby alone), memkit (`use Memkit::OobGC`, defaults), full_mark
# (`full_mark: true`: on Ruby 3.4+ Ruby keeps its own major GCs, the 3.2/3.3
# policy predicts them; the same as memkit elsewhere). gc_x is against none.
#
# Counted from the 101st request. Per shape and mode: GC runs, inside
# requests, majors inside requests, GC runs per request against Ruby alone,
# heap pages (MB) and RSS (MB) at the end, what OobGC grew and why it gave up.
require "optparse"
require "json"
require "rbconfig"

SHAPES = {
  "tiny" => { "OOBGC_ROWS" => "150" },
  "medium" => { "OOBGC_ROWS" => "1500" },
  "large" => { "OOBGC_ROWS" => "8000" },
  "huge" => { "OOBGC_ROWS" => "36000" },
  "malloc" => { "OOBGC_ROWS" => "300", "OOBGC_MALLOC_KB" => "8192" },
  "promoting" => { "OOBGC_ROWS" => "1500", "OOBGC_KEEP" => "20" },
  "cache" => { "OOBGC_ROWS" => "1500", "OOBGC_GROW" => "40" }
}.freeze
# Requests counted per shape, at --scale 1: enough for tens of GCs each.
REQUESTS = { "tiny" => 3000, "medium" => 600, "large" => 300, "huge" => 150, "malloc" => 600, "promoting" => 600,
             "cache" => 600 }.freeze

# Memkit::OobGC's options per mode (none: no middleware).
MODES = { "none" => nil, "memkit" => {}, "full_mark" => { full_mark: true } }.freeze

def child(mode, requests)
  require "memkit"
  require_relative "oobgc_app"
  app = ->(_env) { [200, {}, [OobgcBench.render]] }
  app = Memkit::OobGC.new(app, **MODES.fetch(mode)) if MODES[mode]
  GC.start
  counted = nil
  inside = inside_major = 0
  allocated = 0
  (100 + requests).times do |i|
    if i == 100
      counted = [GC.count, GC.stat(:major_gc_count)]
      allocated = GC.stat(:total_allocated_objects)
      Memkit::OobGC.reset_stats if MODES[mode]
    end
    env = { "rack.after_reply" => [] }
    count = GC.count
    major = GC.stat(:major_gc_count)
    _, _, body = app.call(env)
    body.each { |_| nil }
    if counted
      inside += GC.count - count
      inside_major += GC.stat(:major_gc_count) - major
    end
    env["rack.after_reply"].each(&:call)
  end
  stats = MODES[mode] ? Memkit::OobGC.stats : nil
  page = GC::INTERNAL_CONSTANTS.fetch(:HEAP_PAGE_SIZE) { GC::INTERNAL_CONSTANTS[:HEAP_PAGE_OBJ_LIMIT] * GC::INTERNAL_CONSTANTS[:RVALUE_SIZE] }
  puts JSON.generate(
    gc: GC.count - counted[0], majors: GC.stat(:major_gc_count) - counted[1], inside: inside, inside_major: inside_major,
    objects: (GC.stat(:total_allocated_objects) - allocated) / requests,
    heap_mb: (GC.stat(:heap_eden_pages) * page) / 1048576.0,
    rss_mb: File.read("/proc/self/status")[/VmRSS:\s+(\d+)/, 1].to_i / 1024.0,
    grown_mb: stats ? stats.heap_grown_bytes / 1048576.0 : 0, gave_up: stats&.gave_up, policy: stats&.policy,
    boot_env: stats&.boot_env
  )
end

# Required (bench/oobgc_shape_trace.rb) for SHAPES, REQUESTS and #child alone.
return unless File.expand_path($PROGRAM_NAME) == File.expand_path(__FILE__)

if ARGV[0] == "--child"
  child(ARGV[1], Integer(ARGV[2]))
  exit
end

opts = { scale: 1.0, shapes: SHAPES.keys, modes: %w[none memkit] }
OptionParser.new do |o|
  o.on("--scale X", Float) { |v| opts[:scale] = v }
  o.on("--shapes LIST", Array) { |v| opts[:shapes] = v }
  o.on("--modes LIST", Array, "none always runs (the gc_x base)") { |v| opts[:modes] = (["none"] + v).uniq }
end.parse!(ARGV)
puts "oobgc shapes: #{RUBY_DESCRIPTION}; one process per cell; requests counted after the first 100"
rows = []
opts[:shapes].each do |shape|
  requests = (REQUESTS.fetch(shape) * opts[:scale]).ceil
  results = opts[:modes].to_h do |mode|
    out = IO.popen(SHAPES.fetch(shape), [RbConfig.ruby, "-I#{File.expand_path('../lib', __dir__)}", __FILE__, "--child", mode,
                                         requests.to_s], &:read)
    [mode, JSON.parse(out.lines.last)]
  end
  none = results["none"]
  results.each do |mode, r|
    outside = r["gc"].zero? ? "-" : format("%.1f", 100.0 * (r["gc"] - r["inside"]) / r["gc"])
    ratio = none["gc"].zero? ? "-" : format("%.2f", r["gc"].fdiv(none["gc"]))
    rows << [shape, mode, r["objects"], r["gc"], r["majors"], r["inside"], r["inside_major"], outside, ratio,
             format("%.1f", r["heap_mb"]), format("%.1f", r["rss_mb"]), format("%.1f", r["grown_mb"]),
             r["gave_up"] ? "yes" : "-"]
    puts "  #{shape} boot_env: #{r['boot_env']}" if r["boot_env"]&.any?
    puts "  #{shape} gave_up: #{r['gave_up']}" if r["gave_up"]
  end
end
header = %w[shape mode objects/req gc majors inside inside_major outside% gc_x heap_MB rss_MB grown_MB gave_up]
widths = header.each_index.map { |i| ([header[i]] + rows.map { |r| r[i].to_s }).map(&:size).max }
puts header.each_with_index.map { |h, i| h.ljust(widths[i]) }.join("  ")
rows.each { |r| puts r.each_with_index.map { |v, i| v.to_s.ljust(widths[i]) }.join("  ") }
