# frozen_string_literal: true

require "test_helper"

# Each file a user may require on its own (README, docs/) loads and works in
# a fresh Ruby with nothing else of memkit loaded: the test process has
# loaded everything, so a file that only works after lib/memkit.rb would
# pass every other test.
class EntryPointsTest < Minitest::Test
  # Each with a line that uses what it loaded.
  ENTRIES = {
    "memkit" => "Memkit.rss.positive? or abort",
    "memkit/fork" => "Memkit::Warmup",
    "memkit/cow" => "Memkit::Cow",
    "memkit/cgroup" => "Memkit::Cgroup",
    "memkit/allocator" => "Memkit::Allocator",
    "memkit/doctor" => "Memkit::Doctor",
    "memkit/metrics" => "Memkit::Metrics",
    "memkit/memory_limit" => "Memkit::MemoryLimit",
    "memkit/soak" => "Memkit::Soak::TreeSampler.new(Process.pid)",
    "memkit/refork" => "Memkit::Refork",
    "memkit/fiber_pool" => "Memkit::FiberPool",
    "memkit/out_of_band" => "Memkit::OutOfBand",
    # Served past the point where the collector sizes the heap, which reads
    # this process's RSS (Memkit.rss).
    "memkit/oob_gc" => <<~RUBY
      app = Memkit::OobGC.new(->(_env) { Array.new(2_000) { "x" * 10 }; [200, {}, ["ok"]] }, log: ->(_) {})
      300.times do
        env = { "rack.after_reply" => [] }
        body = app.call(env).last
        body.close if body.respond_to?(:close)
        env["rack.after_reply"].each(&:call)
      end
      Memkit::OobGC.stats.requests >= 300 or abort
    RUBY
  }.freeze

  ENTRIES.each do |path, use|
    define_method("test_#{path.tr("/", "_")}_loads_and_works_alone") do
      out, status = Open3.capture2e(RbConfig.ruby, "-I#{ROOT}/lib", "-e", "require #{path.dump}", "-e", use)
      assert status.success?, "require #{path.dump} alone:\n#{out}"
    end
  end
end
