# frozen_string_literal: true

# What a request costs in one process, GC included, with and without
# Memkit::OobGC: bench/oobgc_app.rb's request served as a server would
# (rack.after_reply after the response), timed inside the request and after
# it, with the GC time (GC.stat(:time)), GC runs, majors and page faults. For
# a shape where a real server's throughput is off (bench/oobgc_matrix.rb),
# without the server.
#
#   OOBGC_ROWS=300 OOBGC_MALLOC_KB=8192 ruby -Ilib bench/oobgc_request_cost.rb [requests] [modes]
#   script/ruby34 env OOBGC_ROWS=300 OOBGC_MALLOC_KB=8192 ruby -Ilib bench/oobgc_request_cost.rb
#
# Modes (comma-separated; default all): none (Ruby alone), memkit
# (`use Memkit::OobGC`), hook (and Puma's out_of_band hook after every
# request, as `plugin :memkit` gives it when no request waits); each also
# with "+release" (Memkit::MallocRelease on, as `plugin :memkit` and
# `require "memkit/fork"` start it). One child process per mode, counted
# after the first 100 requests.
require "rbconfig"

MODES = %w[none memkit hook none+release memkit+release hook+release].freeze

def child(mode, requests)
  require "memkit"
  require_relative "oobgc_app"
  app = ->(_env) { [200, {}, [OobgcBench.render]] }
  app = Memkit::OobGC.new(app) unless mode.start_with?("none")
  Memkit::MallocRelease.start if mode.end_with?("+release")
  hook = mode.start_with?("hook")
  clock = -> { Process.clock_gettime(Process::CLOCK_MONOTONIC) }
  faults = -> { File.read("/proc/self/stat").split[9].to_i }
  inside = after = 0.0
  base = nil
  (100 + requests).times do |i|
    base = [GC.count, GC.stat(:major_gc_count), faults.call, GC.stat(:time)] if i == 100
    env = { "rack.after_reply" => [] }
    started = clock.call
    _, _, body = app.call(env)
    body.each { |_| nil }
    served = clock.call
    env["rack.after_reply"].each(&:call)
    Memkit::OobGC.out_of_band if hook
    next if i < 100

    inside += served - started
    after += clock.call - served
  end
  rss = File.read("/proc/self/status")[/VmRSS:\s+(\d+)/, 1].to_i >> 10
  format("%-15s %8.2f %8.2f %8.2f %8.3f %5d %6d %9d %6d", mode, inside * 1000 / requests, after * 1000 / requests,
         (inside + after) * 1000 / requests, (GC.stat(:time) - base[3]).fdiv(requests), GC.count - base[0],
         GC.stat(:major_gc_count) - base[1], faults.call - base[2], rss)
end

if ENV["OOBGC_COST_CHILD"]
  puts child(ENV["OOBGC_COST_CHILD"], Integer(ARGV.fetch(0)))
  exit
end

requests = Integer(ARGV.fetch(0, "400"))
modes = ARGV[1] ? ARGV[1].split(",") : MODES
shape = ENV.select { |k, _| k.start_with?("OOBGC_") }.map { |k, v| "#{k}=#{v}" }.join(" ")
puts "oobgc request cost: #{RUBY_DESCRIPTION}; #{shape.empty? ? 'default shape' : shape}; " \
     "#{requests} requests after 100"
puts format("%-15s %8s %8s %8s %8s %5s %6s %9s %6s", "mode", "in_ms", "after_ms", "total_ms", "gc_ms", "gc", "majors",
            "minflt", "rss_MB")
lines = modes.map do |mode|
  out = IO.popen({ "OOBGC_COST_CHILD" => mode }, [RbConfig.ruby, "-I#{File.expand_path('../lib', __dir__)}",
                                                 __FILE__, requests.to_s], &:read)
  abort "#{mode} failed" unless $?.success?
  puts out
  out
end
none = lines.find { |l| l.start_with?("none ") }&.split
if none
  puts "total ms per request against none:"
  lines.each { |l| f = l.split; puts format("  %-15s %.2fx", f[0], f[3].to_f / none[3].to_f) }
end
