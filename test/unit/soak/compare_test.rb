# frozen_string_literal: true

require "test_helper"

# A comparison run is Memkit::Soak.run in a new Ruby process under another
# environment, called through the library (no CLI, no flags).
class SoakCompareTest < Minitest::Test
  Compare = Memkit::Soak::Compare
  HELLO = File.join(Memkit::TestHelpers::ROOT, "bench", "soak", "hello.ru")

  def test_runs_the_soak_in_a_child_under_the_environment
    spec = Compare.parse("arena1:MALLOC_ARENA_MAX=1 MEMKIT_COMPARE_PROBE=yes")
    assert_equal({ "MALLOC_ARENA_MAX" => "1", "MEMKIT_COMPARE_PROBE" => "yes" }, spec.env)
    result = Compare.run(spec, HELLO, requests: 1_500, sample_every: 150, attribute: false)
    assert_equal "arena1", result.label
    assert_equal 11, result.samples.size
    refute_equal Process.pid, result.pid, "ran in another process"
    assert_equal "plateau", result.verdict.verdict, result.verdict.reason
  end

  def test_the_child_error_names_the_comparison_and_the_keyword
    spec = Compare.parse("a:MALLOC_ARENA_MAX=2")
    error = assert_raises(Memkit::Error) { Compare.run(spec, HELLO, requests: 10, sample_every: 50) }
    assert_equal "comparison a: sample_every: 50 is more than requests: 10", error.message
    error = assert_raises(Memkit::InvalidArgument) { Compare.run(spec, HELLO, pid: 1) }
    assert_match(/cannot pass pid/, error.message)
  end

  def test_parse_errors_name_the_comparison_not_a_flag
    { "nonsense" => /expected NAME:VAR=VALUE/, "a:B" => /"B" is not VAR=VALUE/, "a: " => /no VAR=VALUE/,
      "je:LD_PRELOAD=/nonexistent/x.so" => /LD_PRELOAD library not found/ }.each do |text, message|
      error = assert_raises(Memkit::InvalidArgument, text) { Compare.parse(text) }
      assert_match(/\Acomparison /, error.message)
      assert_match message, error.message
      refute_match(/--/, error.message)
    end
  end
end
