# frozen_string_literal: true

# Seed 002 reproduced in Ruby: code compiled per request into a table that
# only grows, against the same code compiled once and reused, each under
# glibc malloc and under jemalloc (Debian's libjemalloc2 through LD_PRELOAD),
# 200,000 requests, rss sampled every 1,000 as in the seed. Writes one chart
# with the four curves and prints the verdicts.
#
#   bundle exec ruby -Ilib bench/soak_seed002.rb [--requests N] [--svg docs/soak_seed002.svg] [--html FILE] [--json FILE]
require "optparse"
require "memkit"
require "memkit/cli"
require "json"

requests = 200_000
svg = File.expand_path("../docs/soak_seed002.svg", __dir__)
html = nil
json = nil
OptionParser.new do |o|
  o.on("--requests N", Integer) { |v| requests = v }
  o.on("--json FILE", "also save every run's result") { |v| json = v }
  o.on("--svg FILE") { |v| svg = v }
  o.on("--html FILE") { |v| html = v }
end.parse!(ARGV)

jemalloc = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
abort "bench/soak_seed002.rb: #{jemalloc} is missing (apt-get install libjemalloc2)" unless File.exist?(jemalloc)

apps = { "grow" => "compile_grow.ru", "reuse" => "compile_reuse.ru" }
allocators = { "glibc" => {}, "jemalloc" => { "LD_PRELOAD" => jemalloc } }
every = [requests / 200, 1].max
args = ["--requests", requests.to_s, "--sample-every", every.to_s, "--no-attribute"]
results = []
allocators.each do |alloc, env|
  apps.each do |name, file|
    spec = Memkit::Soak::Compare::Spec.new(name: "#{alloc} #{name}", env: env)
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    result = Memkit::Soak::Compare.run(spec, File.expand_path("soak/#{file}", __dir__), args)
    took = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
    warn format("%-16s %-12s %8.1f B/request  %6.1f s", spec.name, result.verdict.verdict, result.bytes_per_request, took)
    results << result
  end
end
results.sort_by! { |r| [r.label.end_with?("grow") ? 0 : 1, r.label] }

rows = results.map do |r|
  first = r.samples.first.rss
  last = r.samples.last.rss
  at_warmup = r.samples.find { |s| s.requests >= r.warmup }.rss
  [r.label, r.verdict.verdict, r.bytes_per_request, r.metric, r.confidence.join(".."), Memkit::Units.human(first),
   Memkit::Units.human(last), Memkit::Units.human(last - at_warmup), r.malloc_source.split(" (").first]
end
puts "memkit soak, seed 002 in Ruby: #{requests} requests per run, rss every #{every}"
puts Memkit::CLI.table(%w[run verdict B/request metric 95%CI rss@0 rss@end growth_after_warmup malloc_stats], rows, left: [0, 1, 3, 8])
by = results.to_h { |r| [r.label, r] }
%w[grow reuse].each do |app|
  g = by["glibc #{app}"].samples.last.rss
  j = by["jemalloc #{app}"].samples.last.rss
  puts format("%s: final rss jemalloc/glibc = %.2f", app, j.fdiv(g))
end
puts format("final rss grow/reuse: glibc %.2f, jemalloc %.2f",
            by["glibc grow"].samples.last.rss.fdiv(by["glibc reuse"].samples.last.rss),
            by["jemalloc grow"].samples.last.rss.fdiv(by["jemalloc reuse"].samples.last.rss))
title = "seed 002 in Ruby: compiled code per request, grow vs reuse, glibc vs jemalloc"
Memkit::Soak::AtomicFile.write(json, JSON.generate(results.map(&:to_h))) if json
Memkit::Soak::AtomicFile.write(svg, Memkit::Soak::Chart.svg(results, title: title)) if svg
Memkit::Soak::AtomicFile.write(html, Memkit::Soak::Chart.html(results, title: title)) if html
puts "wrote #{[svg, html, json].compact.join(', ')}"
