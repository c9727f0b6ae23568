# frozen_string_literal: true

# bench/cow_app.rb with the first-use work a real app's workers do after
# fork, for bench/refork.rb: a fragment cache filled on first use of each
# key, code generated the first time a route is hit, and aggregates memoized
# per category. Every worker ends up doing the same first-use work (the same
# keys, the same routes), which is what a refork from a warm worker shares.
#
#   GET /?k=N   the CowApp page plus fragment N (N < 6000) and route N % 1500
require_relative "cow_app"
CowApp.boot

module ReforkApp
  FRAGMENTS = {}
  AGGREGATES = {}
  module Routes; end

  def self.call(env)
    return CowApp.call(env) unless env["PATH_INFO"] == "/"

    k = env["QUERY_STRING"].to_s[/k=(\d+)/, 1].to_i % 6000
    record = CowApp.by_id[k]
    fragment = FRAGMENTS[k] ||= Array.new(4) { |i| "<p>#{record['name']} #{record['description']} #{i}</p>" }.join
    route = :"route_#{k % 1500}"
    unless Routes.respond_to?(route)
      Routes.module_eval("def self.#{route}(r) = [r['id'], r['sku'].upcase, r['tags'].sort.join(',')].join('|')",
                         __FILE__, __LINE__)
    end
    category = record["category"]
    aggregate = AGGREGATES[category] ||= CowApp.by_category[category].sum { |r| r["price"] }.round(2)
    status, headers, body = CowApp.call(env)
    [status, headers, [*body, "\n", fragment, Routes.public_send(route, record), aggregate.to_s]]
  end
end

run ReforkApp
