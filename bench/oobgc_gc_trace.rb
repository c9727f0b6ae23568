# frozen_string_literal: true

# Every GC around bench/oobgc_app.rb's requests, in one process: where it ran
# (inside a request or after it, out of band), why (latest_gc_info's gc_by
# and major_by) and the malloc limits after it; then a tally. For reading why
# Memkit::OobGC runs more GCs than Ruby alone on a shape of
# bench/oobgc_shapes.rb.
#
#   OOBGC_ROWS=300 OOBGC_MALLOC_KB=8192 ruby -Ilib bench/oobgc_gc_trace.rb memkit|hook|none [requests] [shown]
#
# hook: memkit with Puma's out_of_band hook (`plugin :memkit`) called after
# every request, as Puma does when no other request is waiting.
#
# In a chroot, pass the shape through env: script/ruby34 env OOBGC_ROWS=... ruby ...
require "memkit"
require_relative "oobgc_app"

mode = ARGV.fetch(0)
requests = Integer(ARGV.fetch(1, "600"))
shown = Integer(ARGV.fetch(2, "12"))
app = ->(_env) { [200, {}, [OobgcBench.render]] }
app = Memkit::OobGC.new(app) unless mode == "none"
GC.start

def why = GC.latest_gc_info.slice(:gc_by, :major_by)

lines = []
tally = Hash.new(0)
(100 + requests).times do |i|
  env = { "rack.after_reply" => [] }
  before = GC.count
  _, _, body = app.call(env)
  body.each { |_| nil }
  inside = GC.count - before
  inside_why = why if inside.positive?
  before = GC.count
  env["rack.after_reply"].each(&:call)
  Memkit::OobGC.out_of_band if mode == "hook"
  after = GC.count - before
  next if i < 100 || (inside + after).zero?

  tally["inside #{inside_why}"] += inside if inside.positive?
  tally["after #{why}"] += after if after.positive?
  s = GC.stat
  lines << format("request %4d  inside %d %-34s after %d %-34s malloc_limit %5.1f MB  oldmalloc %5.1f of %5.1f MB",
                  i, inside, inside_why&.inspect, after, (why.inspect if after.positive?),
                  s.fetch(:malloc_increase_bytes_limit) / 1e6, s.fetch(:oldmalloc_increase_bytes) / 1e6,
                  s.fetch(:oldmalloc_increase_bytes_limit) / 1e6)
end
puts "#{mode}: #{RUBY_VERSION}, #{requests} requests after 100; the first #{shown} requests with a GC:"
puts lines.first(shown)
puts "GC runs by place and reason:"
tally.sort_by { |_, n| -n }.each { |k, n| puts format("%5d  %s", n, k) }
