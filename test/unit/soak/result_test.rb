# frozen_string_literal: true

require "test_helper"

# How Result combines the rss and live curves, on made-up samples.
class SoakResultTest < Minitest::Test
  Sample = Memkit::Soak::Sample

  def result(samples, baseline: nil, mode: "rack")
    Memkit::Soak::Result.new(target: "app.ru", mode: mode, pid: 1, requests: samples.last.requests, warmup: 0,
                             sample_every: 100, samples: samples, seconds: 1.0, min_leak: 64, baseline: baseline)
  end

  def samples(n: 100, every: 100, rss: ->(_x) { 50_000_000 }, live: ->(_x) { 10_000_000 })
    Array.new(n) do |i|
      x = i * every
      Sample.new(requests: x, seconds: i * 0.01, rss: rss.(x), heap_live_slots: 1, heap_live_bytes: live.(x),
                 malloc_bytes: 0, gc: true)
    end
  end

  def test_live_growth_is_a_leak
    r = result(samples(live: ->(x) { 10_000_000 + 200 * x }))
    assert_equal "leak", r.verdict.verdict
    assert_equal "live", r.metric
    assert_in_delta 200, r.bytes_per_request, 0.1
  end

  # rss climbing while nothing stays alive is heap pages or malloc arenas,
  # which level off: not called a leak.
  def test_rss_growth_with_flat_live_memory_is_inconclusive
    r = result(samples(rss: ->(x) { 50_000_000 + 100 * x }))
    assert_equal "leak", r.verdicts["rss"].verdict
    assert_equal "plateau", r.verdicts["live"].verdict
    assert_equal "inconclusive", r.verdict.verdict
    assert_match(/but live memory is flat/, r.verdict.reason)
  end

  # Growth the sampler itself makes, measured with the app not called, is
  # taken out of the live curve.
  def test_the_baseline_growth_per_sample_is_subtracted
    base = Array.new(12) { |i| Sample.new(requests: 0, seconds: i, rss: 1, heap_live_slots: 1, heap_live_bytes: 40 * i, malloc_bytes: 0, gc: true) }
    r = result(samples(live: ->(x) { 10_000_000 + 40 * (x / 100) }), baseline: base)
    assert_equal 40.0, r.sampler_bytes_per_sample
    assert_equal "plateau", r.verdicts["live"].verdict
    assert_in_delta 0, r.verdicts["live"].full.slope, 1e-9
    assert_equal 40.0, r.to_h[:sampler_bytes_per_sample]
  end

  # A server's rss also grows by garbage until Ruby's GC limits stop it: a
  # URL soak needs a longer window than an in-process one to call a leak.
  def test_a_url_soak_needs_a_longer_window_for_a_leak
    rows = Array.new(101) { |i| Sample.new(requests: i * 200, seconds: i, rss: 50_000_000 + 500 * i * 200, gc: false) }
    url = result(rows, mode: "url")
    assert_equal "inconclusive", url.verdict.verdict
    assert_match(/a leak verdict needs 50000/, url.verdict.reason)
    assert_equal "leak", result(rows).verdict.verdict, "20,000 requests are enough in process"
    long = Array.new(101) { |i| Sample.new(requests: i * 600, seconds: i, rss: 50_000_000 + 500 * i * 600, gc: false) }
    assert_equal "leak", result(long, mode: "url").verdict.verdict
  end
end
