# frozen_string_literal: true

# What Memkit::OobGC costs per request when no GC is due (the common case),
# on the running Ruby: a bare Rack call against the same call through
# `use Memkit::OobGC`, with rack.after_reply run as Unicorn and Puma run it,
# and the Collector alone (`tok = c.started; c.finished(tok)`).
#
#   ruby -Ilib bench/oobgc_overhead.rb [--requests 20000] [--rounds 7] [--processes 7] [--render]
#
# The app allocates a few objects, so GC is rarely due: this times the
# bookkeeping, not the collections (bench/oobgc_shapes.rb counts those).
# Each figure is the median of the rounds, in microseconds per request, and
# then the median over --processes fresh processes: on this bench's 2-core
# VM one process can time the same code at up to twice another's (3.1, the
# collector: 1.7 or 3.0 us, 3.0 or 5.3 us), whatever its rounds.
#
# --render: the collector's calls with bench/oobgc_app.rb's request
# (OOBGC_ROWS, default 150: the "tiny" shape) rendered between them, as in a
# worker, where the request leaves the caches cold for them. Only the calls
# are timed, less the clock's own cost, and only in requests with no GC.
require "optparse"
require "rbconfig"
require "memkit"

opts = { requests: 20_000, rounds: 7, processes: 7, render: false }
OptionParser.new do |o|
  o.on("--render", "a request rendered between the calls (see above)") { opts[:render] = true }
  o.on("--requests N", Integer) { |v| opts[:requests] = v }
  o.on("--rounds N", Integer) { |v| opts[:rounds] = v }
  o.on("--processes N", Integer) { |v| opts[:processes] = v }
end.parse!(ARGV)

def median(values) = values.sort[values.size / 2]

if opts[:processes] > 1
  runs = Array.new(opts[:processes]) do
    out = IO.popen([RbConfig.ruby, "-I#{File.expand_path("../lib", __dir__)}", __FILE__, "--processes", "1",
                    "--requests", opts[:requests].to_s, "--rounds", opts[:rounds].to_s,
                    *("--render" if opts[:render])], &:read)
    abort "oobgc_overhead: a child process failed" unless $?.success?
    out.scan(/^  (\S.*?)\s+(-?[\d.]+) us\/request$/).to_h { |name, us| [name, Float(us)] }
  end
  puts "oobgc overhead: #{RUBY_DESCRIPTION}; #{opts[:requests]} requests x #{opts[:rounds]} rounds, median; " \
       "median of #{opts[:processes]} processes (each process's figure in brackets)"
  runs.first.each_key do |name|
    each = runs.map { |r| r.fetch(name) }
    puts format("  %-28s %7.2f us/request  (%s)", name, median(each), each.map { |v| format("%.2f", v) }.join(" "))
  end
  exit
end

if opts[:render]
  ENV["OOBGC_ROWS"] ||= "150"
  require_relative "oobgc_app"
  collector = Memkit::OobGC::Collector.new(log: nil)
  clock = -> { Process.clock_gettime(Process::CLOCK_MONOTONIC, :float_microsecond) }
  tick = median(Array.new(1_001) { clock.call - clock.call }.map(&:abs))
  spent = nil
  serve = lambda do
    a = clock.call
    token = collector.started
    b = clock.call
    OobgcBench.render
    c = clock.call
    collector.major_next?(token)
    d = clock.call
    count = GC.count
    e = clock.call
    ran = collector.finished(token)
    f = clock.call
    spent&.zip([b - a, d - c, f - e]) { |sums, us| sums << us - tick } if ran.zero? && GC.count == count
  end
  2_000.times { serve.call }
  names = ["started", "major_next?", "finished"]
  figures = names.to_h { |name| [name, []] }
  opts[:rounds].times do
    spent = [[], [], []]
    opts[:requests].times { serve.call }
    names.each_with_index { |name, i| figures[name] << (spent[i].sum / spent[i].size) }
  end
  medians = figures.transform_values { |v| median(v) }
  puts "oobgc overhead, a request rendered between the calls: #{RUBY_DESCRIPTION}; OOBGC_ROWS=#{OobgcBench::ROWS}"
  medians.each { |name, us| puts format("  %-28s %7.2f us/request", name, us) }
  puts format("  %-28s %7.2f us/request", "all three", medians.values.sum)
  exit
end

BODY = ["ok"].freeze
bare = ->(_env) { [200, { "content-type" => "text/plain" }, BODY] }
oob = Memkit::OobGC.new(bare, log: nil)
collector = Memkit::OobGC::Collector.new(log: nil)

serve = lambda do |app|
  env = { "rack.after_reply" => [] }
  _, _, body = app.call(env)
  body.each { |_| nil }
  env["rack.after_reply"].each(&:call)
end

cases = {
  "bare Rack call" => -> { serve.call(bare) },
  "through Memkit::OobGC" => -> { serve.call(oob) },
  "Collector started/finished" => -> { collector.finished(collector.started) }
}

def per_request(requests, &block)
  start = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  requests.times(&block)
  (Process.clock_gettime(Process::CLOCK_MONOTONIC) - start) * 1e6 / requests
end

# Warm up: the profile learns the request, the code paths are hot.
cases.each_value { |c| 2_000.times { c.call } }
GC.start
figures = cases.transform_values { [] }
opts[:rounds].times do
  cases.each { |name, c| figures[name] << per_request(opts[:requests]) { c.call } }
end
medians = figures.transform_values { |v| median(v) }

puts "oobgc overhead: #{RUBY_DESCRIPTION}; #{opts[:requests]} requests x #{opts[:rounds]} rounds, median"
medians.each { |name, us| puts format("  %-28s %7.2f us/request", name, us) }
puts format("  %-28s %7.2f us/request", "OobGC adds", medians["through Memkit::OobGC"] - medians["bare Rack call"])
stats = Memkit::OobGC.stats
puts "  (GC runs in all: #{stats.oob_total} out of band, #{stats.inside_total} inside; policy #{stats.policy})"
