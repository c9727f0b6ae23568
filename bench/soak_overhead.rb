# frozen_string_literal: true

# How much `memkit soak` adds to calling a Rack app in a bare loop.
#
#   bare    app.call(env.dup) and nothing else
#   merge   app.call(env.merge): the bare loop copying the env the way the
#           driver does (Hash#merge skips #dup's call to initialize_copy), so
#           driver/merge is the cost of the driver's own work
#   driver  Soak::RackDriver#drive: a fresh env with rack.input and the
#           callback arrays, body iterated and closed unless an Array,
#           rack.response_finished / rack.after_reply run, as `memkit soak`
#           runs it
#   no-gc   a whole Soak.run with 200 samples and no forced GC (--no-gc)
#   soak    a whole Soak.run with the defaults: 200 samples, a full GC before
#           each (what makes the heap figures exact; its cost is per sample,
#           so it is large against microsecond apps and small against real ones)
#
# Times are this process's CPU time (CLOCK_PROCESS_CPUTIME_ID), not wall
# time: on a machine shared with other jobs, wall time measures the
# neighbours. Even so, the same 0.2 s loop here takes anywhere from 1x to 2x
# from one run to the next, so bare and driver are compared in short chunks
# back to back (their order rotating, so none always starts on the heap
# another left), and the figure is the median of the per-chunk
# ratios. The whole-run columns (no-gc, soak) are medians of whole runs.
#   bundle exec ruby -Ilib bench/soak_overhead.rb [--rounds 7] [--chunks 41]
require "optparse"
require "memkit"

rounds = 7
chunks = 41
OptionParser.new do |o|
  o.on("--rounds N", Integer, "whole soak runs per app") { |v| rounds = v }
  o.on("--chunks N", Integer, "bare/driver chunk pairs per app") { |v| chunks = v }
end.parse!(ARGV)

apps = {
  "hello.ru" => [File.expand_path("soak/hello.ru", __dir__), 200_000],
  "render.ru" => [File.expand_path("soak/render.ru", __dir__), 40_000],
  "churn.ru" => [File.expand_path("../test/fixtures/soak/churn.ru", __dir__), 4_000]
}

def now = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)

def timed
  t = now
  yield
  now - t
end

def median(a) = a.sort[a.size / 2]

HEAD = "%-10s %8s" + " %8s" * 5 + " %8s" * 4
puts RUBY_DESCRIPTION
puts format(HEAD, "app", "requests", "bare", "merge", "driver", "no-gc", "soak", "driver/", "driver/", "no-gc/", "soak/")
puts format(HEAD, "", "", *%w[us/req] * 5, "bare", "merge", "bare", "bare")
apps.each do |name, (path, n)|
  driver = Memkit::Soak::RackDriver.new(path)
  app = driver.app
  base = driver.base_env
  chunk = [n / 10, 1].max
  bare = -> { timed { i = 0; while i < chunk; app.call(base.dup); i += 1; end } }
  merge = -> { timed { i = 0; while i < chunk; app.call(base.merge); i += 1; end } }
  drive = -> { timed { driver.drive(chunk) } }
  [drive, bare, merge].each(&:call) # warm every path before timing
  times = Hash.new { |h, k| h[k] = [] }
  ratios = Hash.new { |h, k| h[k] = [] }
  chunks.times do |k|
    order = %i[bare merge driver].rotate(k)
    t = order.to_h { |name| [name, { bare: bare, merge: merge, driver: drive }.fetch(name).call] }
    t.each { |name, v| times[name] << v / chunk }
    ratios[:bare] << t[:driver] / t[:bare]
    ratios[:merge] << t[:driver] / t[:merge]
  end
  rounds.times do
    times[:nogc] << timed { Memkit::Soak.run(path, requests: n, gc_budget: 0.0, attribute: false) } / n
    times[:soak] << timed { Memkit::Soak.run(path, requests: n, attribute: false) } / n
  end
  m = times.transform_values { |v| median(v) }
  us = ->(k) { format("%.2f", m[k] * 1e6) }
  puts format("%-10s %8d" + " %8s" * 5 + " %8.3f" * 4, name, n, *%i[bare merge driver nogc soak].map(&us),
              *%i[bare merge].map { |k| median(ratios[k]) }, m[:nogc] / m[:bare], m[:soak] / m[:bare])
end
