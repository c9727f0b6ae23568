# frozen_string_literal: true

require "test_helper"
require "json"

# The "Must show" statistics on the sample apps in test/fixtures/soak, each
# run in a new process so one run's heap does not carry into the next.
# Fewer samples than the CLI default keep the file under a minute; the
# default-settings runs are bench/soak_verdicts.rb's.
class SoakVerdictTest < Minitest::Test
  FIXTURES = File.join(Memkit::TestHelpers::ROOT, "test", "fixtures", "soak")

  # Each soak runs in a new Ruby process (not a fork of this one, whose heap
  # grown by other tests would move the figures), as `memkit soak` does.
  def soak(fixture, **options)
    script = <<~RUBY
      require "json"
      options = JSON.parse(ARGV[1], symbolize_names: true)
      begin
        print JSON.generate(Memkit::Soak.run(ARGV[0], **options).to_h)
      rescue Exception => e # anything, reported to the parent as JSON
        print JSON.generate(error: "\#{e.class}: \#{e.message}")
      end
    RUBY
    out, status = Open3.capture2(RbConfig.ruby, "-I#{File.join(Memkit::TestHelpers::ROOT, 'lib')}", "-rmemkit",
                                 "-e", script, File.join(FIXTURES, fixture), JSON.generate(options))
    result = JSON.parse(out, symbolize_names: true)
    flunk result[:error] if result[:error]
    assert status.success?
    result
  end

  def test_a_400_byte_per_request_leak_is_found_within_20000_requests
    r = soak("leak.ru", requests: 20_000, sample_every: 500, attribute: false)
    assert_equal "leak", r[:verdict], r[:reason]
    assert_in_delta 400, r[:bytes_per_request], 100, "within ±25% of 400 B/request"
    lo, hi = r[:confidence_interval]
    assert_operator lo, :<=, r[:bytes_per_request]
    assert_operator hi, :>=, r[:bytes_per_request]
    assert_equal 41, r[:samples].size
  end

  # Three runs keep the suite short; the ten-run statistic at the CLI
  # defaults is bench/soak_verdicts.rb's.
  def test_a_bounded_cache_is_never_called_a_leak
    verdicts = Array.new(3) do
      soak("bounded_cache.ru", requests: 8_000, sample_every: 200, attribute: false)
    end
    leaks = verdicts.count { |r| r[:verdict] == "leak" }
    assert_equal 0, leaks, verdicts.map { |r| "#{r[:verdict]}: #{r[:reason]}" }.uniq.join("\n")
    # Not vacuous: the cache really did grow while it filled (2,000 x 1 KB).
    first = verdicts.first[:samples]
    assert_operator first[10][:heap_live_bytes] + first[10][:malloc_bytes],
                    :>, first[0][:heap_live_bytes] + first[0][:malloc_bytes] + 1_500_000
    assert verdicts.all? { |r| r[:verdict] == "plateau" }, verdicts.map { |r| r[:reason] }.uniq.join("\n")
  end

  def test_heavy_allocation_with_nothing_retained_is_a_plateau
    r = soak("churn.ru", requests: 1_500, sample_every: 25, attribute: false)
    assert_equal "plateau", r[:verdict], r[:reason]
    assert_operator r[:bytes_per_request].abs, :<, 64
  end

  def test_a_leak_of_ruby_objects_is_measured_and_attributed
    require "objspace"
    entry = { id: 12_345, path: "/?n=12345", agent: "memkit-soak/12345" }
    truth = ObjectSpace.memsize_of(entry) + entry.values.sum { |v| ObjectSpace.memsize_of(v) } + 8
    r = soak("leak_objects.ru", requests: 6_000, sample_every: 60, attribute: true)
    assert_equal "leak", r[:verdict], r[:reason]
    assert_in_delta truth, r[:bytes_per_request], truth * 0.25, "retained per request: #{truth} B"
    top = r[:attribution].first
    assert_match(%r{fixtures/soak/leak_objects\.ru:9\z}, top[:site])
    assert_equal "Hash", top[:class_name]
    # Exactly one retained Hash per request of the 600-request traced window,
    # and nothing from the response line (whose objects all died).
    assert_equal 600, top[:count]
    refute r[:attribution].any? { |s| s[:site].end_with?("leak_objects.ru:10") }, r[:attribution].inspect
  end
end
