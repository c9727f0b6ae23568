# frozen_string_literal: true

# test/integration/oob_gc_test.rb's mallocs_megabytes with Puma's hook, with
# the counts printed: 200 requests (8 MB malloc'd and 300 small hashes each)
# after 50 of warm-up, once with Ruby alone and once through Memkit::OobGC.
#   script/ruby34 bundle exec ruby -Ilib bench/oobgc_malloc_probe.rb
require "memkit/oob_gc"

RETAINED = Array.new(100_000) { |i| ["k#{i}", "v#{i}" * (1 + (i % 5)), [i]] }
def serve(app, n, hook:, out_of_band: false)
  n.times do
    env = {}
    env["rack.after_reply"] = [] if hook == :after_reply
    _status, _headers, body = app.call(env)
    body.each { |_| nil }
    env["rack.after_reply"]&.each(&:call)
    Memkit::OobGC.out_of_band if out_of_band
  end
end
app = lambda do |_env|
  rows = Array.new(300) { |i| { "id" => i, "name" => "row #{i}" } }
  [200, {}, [("x" * (8 << 20)).bytesize.to_s, rows.size.to_s]]
end
GC.start
serve(app, 50, hook: :none)
count = GC.count
serve(app, 200, hook: :none)
alone = GC.count - count
oob = Memkit::OobGC.new(app)
serve(oob, 50, hook: :after_reply, out_of_band: true)
Memkit::OobGC.reset_stats
serve(oob, 200, hook: :after_reply, out_of_band: true)
s = Memkit::OobGC.stats
total = s.oob_total + s.inside_total
puts "alone=#{alone} memkit=#{total} (minor #{s.oob_minor} major #{s.oob_major} inside #{s.inside_total}) " \
     "ratio=#{total.fdiv(alone).round(2)}"
