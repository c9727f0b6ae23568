# frozen_string_literal: true

# How long the request after a GC waits: bench/oobgc_app.rb's request served
# in one process through Memkit::OobGC (rack.after_reply called after the
# response, as a server does) and without it. A request queued behind an
# out-of-band GC waits for all of it; Ruby's own GC runs its mark inside a
# request and leaves the sweep to the next allocations.
#
#   ruby -Ilib bench/oobgc_pause.rb [--shapes tiny,medium,...] [--requests 1000]
#
# Per shape: first a minor GC.start swept lazily against the rest of its
# sweep (what sweeping at once adds to the pause), then per mode the GC
# runs, the requests' p99 and the after_reply p99 and max (the out-of-band
# pause), counted after the first 300 requests.
require "optparse"
require "json"
require "rbconfig"

SHAPES = { "tiny" => { "OOBGC_ROWS" => "150" }, "medium" => { "OOBGC_ROWS" => "1500" },
           "promoting" => { "OOBGC_ROWS" => "1500", "OOBGC_KEEP" => "20" },
           "cache" => { "OOBGC_ROWS" => "1500", "OOBGC_GROW" => "40" } }.freeze

def ms(started) = (Process.clock_gettime(Process::CLOCK_MONOTONIC) - started) * 1000

def pct(values, p) = values.sort[(values.size * p).floor.clamp(0, values.size - 1)]

def split
  require_relative "oobgc_app"
  GC.start
  300.times { OobgcBench.render }
  marks = []
  rests = []
  20.times do
    5.times { OobgcBench.render }
    t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    GC.start(full_mark: false, immediate_sweep: false)
    marks << ms(t)
    t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    GC.disable # finishes the sweep
    GC.enable
    rests << ms(t)
  end
  puts JSON.generate(mark: pct(marks, 0.5), rest: pct(rests, 0.5))
end

def serve(mode, requests)
  require "memkit"
  require_relative "oobgc_app"
  app = ->(_env) { [200, {}, [OobgcBench.render]] }
  app = Memkit::OobGC.new(app) if mode == "memkit"
  GC.start
  inside = []
  after = []
  count = nil
  (300 + requests).times do |i|
    count = GC.count if i == 300
    env = { "rack.after_reply" => [] }
    t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    _, _, body = app.call(env)
    body.each { |_| nil }
    served = ms(t)
    t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    env["rack.after_reply"].each(&:call)
    next unless count

    inside << served
    after << ms(t)
  end
  puts JSON.generate(gc: GC.count - count, req_p99: pct(inside, 0.99), after_p99: pct(after, 0.99), after_max: after.max)
end

case ARGV[0]
when "--split" then split
when "--serve" then serve(ARGV[1], Integer(ARGV[2]))
else
  opts = { shapes: SHAPES.keys, requests: 1000 }
  OptionParser.new do |o|
    o.on("--shapes LIST", Array) { |v| opts[:shapes] = v }
    o.on("--requests N", Integer) { |v| opts[:requests] = v }
  end.parse!(ARGV)
  puts "oobgc pause: #{RUBY_DESCRIPTION}; one process per cell; #{opts[:requests]} requests after 300"
  child = ->(env, *args) { JSON.parse(IO.popen(env, [RbConfig.ruby, "-I#{File.expand_path('../lib', __dir__)}", __FILE__, *args], &:read).lines.last) }
  puts format("%-10s %-7s %5s %9s %10s %10s   %s", "shape", "mode", "gc", "req_p99", "after_p99", "after_max", "minor: mark / rest of sweep (ms)")
  opts[:shapes].each do |shape|
    env = SHAPES.fetch(shape)
    s = child.(env, "--split")
    %w[none memkit].each do |mode|
      r = child.(env, "--serve", mode, opts[:requests].to_s)
      puts format("%-10s %-7s %5d %9.2f %10.2f %10.2f   %s", shape, mode, r["gc"], r["req_p99"], r["after_p99"], r["after_max"],
                  mode == "none" ? format("%.2f / %.2f", s["mark"], s["rest"]) : "")
    end
  end
end
