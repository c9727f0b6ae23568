# frozen_string_literal: true

# URL soaks of apps that do not leak, on a real Unicorn with 2 workers (the
# mode where only rss is seen: no live curve to lean on), and of the 400
# B/request leak. Prints one line per run, with its wall time. A URL leak
# verdict needs Verdict::URL_MIN_SPAN (50,000) requests after the warm-up
# (the first fifth), first sample to last: runs of 65,000 requests or more.
#   flock /tmp/memkit-bench.lock bundle exec ruby -Ilib -Itest bench/soak_url.rb [--requests 50000,100000]
#     [--apps rails_like,bounded_cache,leak]
require "optparse"
require "memkit"
require "memkit/loopback"
require "tmpdir"
require "support/servers"

ROOT = File.expand_path("..", __dir__)
APPS = { "rails_like" => "test/fixtures/soak/rails_like.ru", "bounded_cache" => "test/fixtures/soak/bounded_cache.ru",
         "leak" => "test/fixtures/soak/leak.ru", "hello" => "bench/soak/hello.ru",
         "churn" => "test/fixtures/soak/churn.ru" }.freeze
DEFAULT_APPS = %w[rails_like bounded_cache leak].freeze
runs = [3_000, 6_000, 20_000]
apps = DEFAULT_APPS
OptionParser.new do |o|
  o.on("--requests LIST", Array, "run lengths (default 3000,6000,20000)") { |v| runs = v.map { |n| Integer(n) } }
  o.on("--apps LIST", Array, "of #{APPS.keys.join(',')} (default #{DEFAULT_APPS.join(',')})") { |v| apps = v }
end.parse!

puts "#{RUBY_DESCRIPTION}; #{Time.now.utc}"
apps.each do |name|
  path = APPS.fetch(name)
  runs.each do |requests|
    Dir.mktmpdir do |dir|
      server = Memkit::ServersHelper.start_server(:unicorn, File.read(File.join(ROOT, path)), dir: dir,
                                                  port: Memkit::Loopback.free_port, workers: 2)
      begin
        started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        r = Memkit::Soak.run("http://127.0.0.1:#{server.port}/", pid: server.pid, requests: requests, concurrency: 2)
        seconds = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
        puts format("%-14s %6d  %-12s %8s B/request  CI %-18s %4.0fs  %s", name, requests, r.verdict.verdict,
                    r.bytes_per_request, r.confidence.inspect, seconds, r.verdict.reason[0, 110])
      ensure
        Memkit::ServersHelper.stop_server(server)
      end
    end
  end
end
