# frozen_string_literal: true

# memkit's sample app: boot data the workers share with the master, and
# requests that allocate like a small web app does.
require "json"

CATALOG = Array.new(40_000) do |i|
  { "id" => i, "name" => "product #{i}", "tags" => %w[red green blue].rotate(i % 3), "price" => i * 0.25 }
end.freeze
INDEX = CATALOG.to_h { |item| [item["name"], item] }.freeze

run lambda { |env|
  id = env["PATH_INFO"][/\d+/].to_i % CATALOG.size
  body = JSON.generate(CATALOG[id, 50])
  [200, { "content-type" => "application/json", "content-length" => body.bytesize.to_s }, [body]]
}
