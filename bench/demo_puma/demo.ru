# frozen_string_literal: true

# lib/memkit/demo/config.ru, loading memkit by `require "memkit"` (the original uses require_relative, which
# loads the worktree's lib whatever RUBYLIB says, and with the plugin from RUBYLIB, both copies).

# memkit's sample app: boot data the workers share with the master, requests
# that allocate like a small web app does (a few thousand objects each), and
# a /leak endpoint that keeps 2 MB per request so MemoryLimit has a bloated
# worker to replace.
require "json"
require "memkit"

use Memkit::Metrics::Recorder # each worker leaves its counters for the one scrape
use Memkit::OobGC
use Memkit::MemoryLimit, max_uss: ENV.fetch("MEMKIT_DEMO_MAX_USS", "1GB")
map("/metrics") { run Memkit::Metrics.new }

CATALOG = Array.new(40_000) do |i|
  { "id" => i, "name" => "product #{i}", "tags" => %w[red green blue].rotate(i % 3), "price" => i * 0.25 }
end.freeze
INDEX = CATALOG.to_h { |item| [item["name"], item] }.freeze
LEAK = []

run lambda { |env|
  LEAK << ("x" * (2 << 20)) if env["PATH_INFO"].start_with?("/leak")
  id = env["PATH_INFO"][/\d+/].to_i % CATALOG.size
  # Rows shaped for the page, as a view or serializer builds them: the
  # short-lived objects that make a web app's GC work.
  rows = CATALOG[id, 200].map do |item|
    { "id" => item["id"], "name" => item["name"].upcase, "url" => "/products/#{item['id']}",
      "tags" => item["tags"].map(&:capitalize), "price" => format("%.2f", item["price"]) }
  end
  body = JSON.generate(rows)
  [200, { "content-type" => "application/json", "content-length" => body.bytesize.to_s }, [body]]
}
