# frozen_string_literal: true

# Each GC of a fresh process serving test/integration/oob_gc_test.rb's
# "keeping" app (6,000 strings kept for 20 requests, 2,000 rows a request)
# through Memkit::OobGC with rack.after_reply: GCs inside a request with
# what started them, GCs after it with the major's reason, each pool's slots
# and Ruby's shared allocatable slots; then OobGC's stats.
#   script/ruby34 bundle exec ruby -Ilib bench/oobgc_keeping_probe.rb [requests]
require "memkit/oob_gc"

RETAINED = Array.new(100_000) { |i| ["k#{i}", "v#{i}" * (1 + (i % 5)), [i]] }
kept = []
keeping = lambda do |_env|
  kept << Array.new(6_000) { |i| "kept #{i}" }
  kept.shift if kept.size > 20
  Array.new(2_000) { |i| { "id" => i, "name" => "row #{i}", "tags" => %w[a b c].map { |t| t + i.to_s } } }
  [200, {}, ["ok"]]
end

pools = -> { (0..2).map { |i| GC.stat_heap(i, :heap_eden_slots) } }
GC.start
app = Memkit::OobGC.new(keeping)
Integer(ARGV.fetch(0, "400")).times do |n|
  env = { "rack.after_reply" => [] }
  count = GC.count
  before = [pools.(), GC.stat(:heap_allocatable_slots)]
  app.call(env)
  inside = GC.count - count
  puts "#{n} inside #{inside} by=#{GC.latest_gc_info(:gc_by)} slots=#{before[0]} allocatable=#{before[1]}" if inside.positive?
  env["rack.after_reply"].each(&:call)
  after = GC.count - count - inside
  next unless after.positive?

  puts "#{n} after #{after} major_by=#{GC.latest_gc_info(:major_by).inspect} slots=#{pools.()} " \
       "allocatable=#{GC.stat(:heap_allocatable_slots)}"
end
p Memkit::OobGC.stats.to_h
