# frozen_string_literal: true

# The verdict statistics at the CLI defaults (20,000 requests, a sample every
# 100, warm-up 4,000, --min-leak 64): each sample app soaked RUNS times, each
# run a fresh `memkit soak --json` process.
#
#   bundle exec ruby -Ilib bench/soak_verdicts.rb [--runs 10] [--churn-runs 3]
require "json"
require "open3"
require "optparse"
require "rbconfig"

runs = 10
churn_runs = 3
OptionParser.new do |o|
  o.on("--runs N", Integer) { |v| runs = v }
  o.on("--churn-runs N", Integer) { |v| churn_runs = v }
end.parse!(ARGV)

exe = File.expand_path("../exe/memkit", __dir__)
fixtures = File.expand_path("../test/fixtures/soak", __dir__)
cases = { "leak.ru" => [runs, "leak, 400 B/request"], "leak_objects.ru" => [runs, "leak, a Hash and 2 Strings per request"],
          "bounded_cache.ru" => [runs, "plateau (2,000 x 1 KB, full by request 2,000)"],
          "churn.ru" => [churn_runs, "plateau (100 KB garbage per request)"] }
puts format("%-17s %4s  %-44s %-28s %s", "app", "runs", "expected", "verdicts", "bytes_per_request min / median / max (metric)")
cases.each do |file, (n, expected)|
  results = Array.new(n) do
    out, err, status = Open3.capture3(RbConfig.ruby, exe, "soak", File.join(fixtures, file), "--json", "--no-attribute")
    abort "#{file}: #{err}" unless status.success?
    JSON.parse(out)
  end
  counts = results.map { |r| r["verdict"] }.tally.map { |v, c| "#{c} #{v}" }.join(", ")
  bpr = results.map { |r| r["bytes_per_request"] }.sort
  metrics = results.map { |r| r["metric"] }.tally.keys.join("/")
  puts format("%-17s %4d  %-44s %-28s %.1f / %.1f / %.1f (%s)", file, n, expected, counts, bpr.first, bpr[bpr.size / 2], bpr.last, metrics)
end
