# frozen_string_literal: true

require "test_helper"

# `memkit demo` is the README's first command: it must boot a real server,
# report it, and leave nothing running.
class DemoTest < Minitest::Test
  def test_demo_on_unicorn_and_puma
    %w[unicorn puma].each do |server|
      # Enough requests that the workers which replaced the bloated ones
      # run GCs of their own after their first requests.
      out, err, status = memkit("demo", "--server", server, "--requests", "200")
      assert status.success?, "#{server}: #{err}"
      assert_match(/Sent 200 requests/, out)
      assert_match(/^\s*total\s+5 processes/, out, "master and 4 workers")
      workers = out.lines.grep(server == "unicorn" ? /unicorn worker\[\d\]/ : /cluster worker \d/)
      assert_equal 4, workers.size, out
      assert_match(/really uses .* \(PSS\)/, out)
      # MemoryLimit replaced bloated workers the server's own way, and no request failed.
      assert_match(/^  memkit: worker \d+ uss .* > limit .*asking #{server} to replace it/, out)
      replaced = out[/none failed.*; (\d+) workers replaced/, 1].to_i
      assert_operator replaced, :>=, 1, out
      summary = /more requests. Memkit::OobGC in \d+ workers: (\d+) GC runs between requests, (\d+) inside/
      between, inside = out.match(summary)&.captures&.map(&:to_i)
      refute_nil between, out
      assert_operator inside, :>=, 0, out
      # "Most": on Ruby 3.3 and 3.4 behind Puma, 3-10 of about 24 GC runs still
      # land inside requests (docs/BENCHMARKS.md, OobGC on real servers).
      assert_operator between, :>, inside, "#{server}: most GC runs between requests: #{out}"
      master = out[/^\s*(\d+)\s+\d+\s+(unicorn master|puma)/, 1].to_i
      refute File.exist?("/proc/#{master}"), "#{server} master #{master} is gone after the demo"
    end
  end

  def test_demo_usage_errors
    _, err, status = memkit("demo", "--workers", "0")
    assert_equal 2, status.exitstatus
    assert_match(/\Amemkit: --workers must be 1 or more/, err)
    _, _, status = memkit("demo", "--server", "webrick")
    assert_equal 2, status.exitstatus
  end
end
