# frozen_string_literal: true

# The false-leak matrix, wider than test/integration/soak_false_leak_test.rb:
# apps that do not leak at run lengths from 10 to 200,000 requests and
# several sampling intervals, and the 400 B/request leak beside them. Each
# app's runs share one new Ruby process, as runs one after another would.
# Prints one line per run and, last, the count of leak verdicts on the apps
# that do not leak (the answer must be 0).
#   bundle exec ruby -Ilib bench/soak_false_leaks.rb [--apps hello,bounded_cache,churn,rails_like,leak]
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
LENGTHS = [10, 20, 50, 100, 200, 500, 1_000, 2_000, 3_000, 5_000, 10_000, 20_000, 50_000, 200_000].freeze

apps = APPS.keys
OptionParser.new { |o| o.on("--apps LIST", Array) { |v| apps = v } }.parse!(ARGV)

# [requests, sample_every]: the default (requests / 200) everywhere, every
# request up to 1,000, and every 7th and 1,000th where that gives 20..1,000 samples.
runs = LENGTHS.flat_map do |n|
  [[n, nil], ([n, 1] if n <= 1_000 && n > 200), ([n, 7] if n / 7 >= 20 && n / 7 <= 1_000),
   ([n, 1_000] if n / 1_000 >= 20)].compact
end

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
