# frozen_string_literal: true

# memkit's sample app: boot data the workers share with the master, requests
# that allocate like a small web app does, and a /leak endpoint that keeps
# 2 MB per request so MemoryLimit has a bloated worker to replace.
require "json"
require_relative "../../memkit"

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
  body = JSON.generate(CATALOG[id, 200])
  [200, { "content-type" => "application/json", "content-length" => body.bytesize.to_s }, [body]]
}
