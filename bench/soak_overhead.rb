# frozen_string_literal: true

# How much `memkit soak` adds to calling a Rack app in a bare loop.
#
#   bare    app.call(env.dup) and nothing else
#   driver  Soak::RackDriver#drive: fresh env with rack.input, body iterated
#           and closed, rack.response_finished / rack.after_reply run
#   no-gc   a whole Soak.run with 200 samples and no forced GC (--no-gc)
#   soak    a whole Soak.run with the defaults: 200 samples, a full GC before
#           each (what makes the heap figures exact; its cost is per sample,
#           so it is large against microsecond apps and small against real ones)
#
# Times are this process's CPU time (CLOCK_PROCESS_CPUTIME_ID), not wall
# time: on a machine shared with other jobs, wall time measures the
# neighbours. Rounds are interleaved and the median kept.
#   bundle exec ruby -Ilib bench/soak_overhead.rb [--rounds 7]
require "optparse"
require "memkit"

rounds = 7
OptionParser.new { |o| o.on("--rounds N", Integer) { |v| rounds = v } }.parse!(ARGV)

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

puts format("%-10s %8s %11s %11s %11s %11s %8s %8s %8s", "app", "requests", "bare", "driver", "no-gc", "soak",
            "driver/", "no-gc/", "soak/")
puts format("%-10s %8s %11s %11s %11s %11s %8s %8s %8s", "", "", "us/request", "us/request", "us/request", "us/request",
            "bare", "bare", "bare")
apps.each do |name, (path, n)|
  driver = Memkit::Soak::RackDriver.new(path)
  app = driver.app
  base = driver.base_env
  driver.drive(n / 10) # warm both paths before timing
  times = Hash.new { |h, k| h[k] = [] }
  rounds.times do
    GC.start
    times[:bare] << timed { i = 0; while i < n; app.call(base.dup); i += 1; end }
    GC.start
    times[:driver] << timed { driver.drive(n) }
    times[:nogc] << timed { Memkit::Soak.run(path, requests: n, gc_budget: 0.0, attribute: false) }
    times[:soak] << timed { Memkit::Soak.run(path, requests: n, attribute: false) }
  end
  m = times.transform_values { |v| median(v) }
  us = ->(k) { format("%.2f", m[k] * 1e6 / n) }
  puts format("%-10s %8d %11s %11s %11s %11s %8.3f %8.3f %8.3f", name, n, us[:bare], us[:driver], us[:nogc], us[:soak],
              m[:driver] / m[:bare], m[:nogc] / m[:bare], m[:soak] / m[:bare])
end
