# frozen_string_literal: true

# The false-leak matrix, wider than test/integration/soak_false_leak_test.rb:
# apps that do not leak at run lengths from 10 to 200,000 requests and
# several sampling intervals, and the 400 B/request leak beside them. Each
# app's runs share one new Ruby process, as runs one after another would.
# Prints one line per run and, last, the count of leak verdicts on the apps
# that do not leak (the answer must be 0).
#   bundle exec ruby -Ilib bench/soak_false_leaks.rb [--apps hello,bounded_cache,rails_like,leak,churn]
require "json"
require "open3"
require "optparse"
require "rbconfig"

ROOT = File.expand_path("..", __dir__)
APPS = {
  "hello" => "bench/soak/hello.ru", "bounded_cache" => "test/fixtures/soak/bounded_cache.ru",
  "churn" => "test/fixtures/soak/churn.ru", "rails_like" => "test/fixtures/soak/rails_like.ru",
  "leak" => "test/fixtures/soak/leak.ru"
}.freeze
LENGTHS = [10, 100, 1_000, 2_000, 3_000, 5_000, 20_000, 200_000].freeze

apps = %w[hello bounded_cache rails_like leak]
OptionParser.new { |o| o.on("--apps LIST", Array) { |v| apps = v } }.parse!(ARGV)

# [requests, sample_every]: the default (requests / 200) at every length,
# every request at 200, and every 1,000th at 20,000 (21 samples). About
# 10 runs of ~200 samples an app: a forced GC per sample is most of the time.
runs = LENGTHS.map { |n| [n, nil] } + [[200, 1], [20_000, 1_000]]

child = <<~RUBY
  require "json"
  JSON.parse(ARGV[1]).each do |requests, every|
    r = Memkit::Soak.run(ARGV[0], requests: requests, sample_every: every, attribute: false)
    puts JSON.generate([requests, r.sample_every, r.verdict.verdict, r.bytes_per_request, r.metric,
                        r.to_h[:sampler_bytes_per_sample], r.verdict.reason])
    $stdout.flush
  end
RUBY

puts "#{RUBY_DESCRIPTION}; #{runs.size} runs per app"
false_leaks = 0
apps.each do |name|
  IO.popen([RbConfig.ruby, "-I#{ROOT}/lib", "-rmemkit", "-e", child, File.join(ROOT, APPS.fetch(name)),
            JSON.generate(runs)]) do |io|
    io.each_line do |line|
      requests, every, verdict, bpr, metric, sampler, reason = JSON.parse(line)
      false_leaks += 1 if verdict == "leak" && name != "leak"
      puts format("%-14s %7d %5d  %-12s %9s %-4s sampler %s  %s", name, requests, every, verdict, bpr, metric, sampler,
                  reason[0, 90])
    end
  end
end
puts "leak verdicts on apps that do not leak: #{false_leaks}"
