# frozen_string_literal: true

# URL soaks of apps that do not leak, on a real Unicorn with 2 workers (the
# mode where only rss is seen: no live curve to lean on), and of the 400
# B/request leak. Prints one line per run.
#   flock /tmp/memkit-bench.lock bundle exec ruby -Ilib -Itest bench/soak_url.rb
require "memkit"
require "memkit/loopback"
require "tmpdir"
require "support/servers"

ROOT = File.expand_path("..", __dir__)
APPS = { "rails_like" => "test/fixtures/soak/rails_like.ru", "bounded_cache" => "test/fixtures/soak/bounded_cache.ru",
         "leak" => "test/fixtures/soak/leak.ru" }.freeze
RUNS = [3_000, 6_000, 20_000].freeze

puts RUBY_DESCRIPTION
APPS.each do |name, path|
  RUNS.each do |requests|
    Dir.mktmpdir do |dir|
      server = Memkit::ServersHelper.start_server(:unicorn, File.read(File.join(ROOT, path)), dir: dir,
                                                  port: Memkit::Loopback.free_port, workers: 2)
      begin
        r = Memkit::Soak.run("http://127.0.0.1:#{server.port}/", pid: server.pid, requests: requests, concurrency: 2)
        puts format("%-14s %6d  %-12s %8s B/request  CI %-18s %s", name, requests, r.verdict.verdict, r.bytes_per_request,
                    r.confidence.inspect, r.verdict.reason[0, 100])
      ensure
        Memkit::ServersHelper.stop_server(server)
      end
    end
  end
end
