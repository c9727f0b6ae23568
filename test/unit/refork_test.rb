# frozen_string_literal: true

require "test_helper"
require "memkit/refork"

class ReforkPolicyTest < Minitest::Test
  MIB = 1_048_576
  Reading = Memkit::Refork::Reading

  def reading(growth_mib, shared_mib: 180, parent_mib: 200, requests: 500, pid: 1)
    Reading.new(pid: pid, uss_growth: growth_mib * MIB, shared: shared_mib * MIB, parent_rss: parent_mib * MIB,
                requests: requests)
  end

  def workers(*growths, **kw)
    growths.each_with_index.map { |g, i| reading(g, pid: 100 + i, **kw) }
  end

  def policy(**opts) = Memkit::Refork::Policy.new(confirm: 1, **opts)

  def test_waits_while_workers_have_barely_diverged
    decision = policy.check(workers(2, 3, 4, 3), now: 0)
    refute decision.refork?
    assert_equal :healthy, decision.reason
    assert_equal 20 * MIB, decision.threshold, "10% of a 200 MiB parent"
  end

  def test_reforks_once_the_median_worker_grew_past_the_threshold
    decision = policy.check(workers(25, 30, 22, 28), now: 0)
    assert decision.refork?
    assert_equal :growth, decision.reason
    assert_equal 26.5 * MIB, decision.growth
    assert_match(/refork \(growth\)/, decision.to_s)
  end

  def test_one_outlier_worker_does_not_trigger_and_one_cold_worker_does_not_hold_back
    refute policy.check(workers(2, 3, 90, 2), now: 0).refork?, "one worker grew: not a decay of the tree"
    assert policy.check(workers(30, 30, 30, 1), now: 0).refork?
  end

  def test_small_parent_uses_the_absolute_floor
    decision = policy.check(workers(5, 5, shared_mib: 18, parent_mib: 20), now: 0)
    refute decision.refork?, "5 MiB is 25% of a 20 MiB parent but under min_growth (8 MiB)"
    assert_equal 8 * MIB, decision.threshold
    assert policy.check(workers(9, 9, shared_mib: 18, parent_mib: 20), now: 0).refork?
  end

  def test_lost_sharing_triggers_even_below_the_growth_fraction
    # 15 MiB of growth is under 10% of a 400 MiB parent, but the workers share only 40% of it.
    decision = policy.check(workers(15, 15, shared_mib: 160, parent_mib: 400), now: 0)
    assert decision.refork?
    assert_equal :sharing, decision.reason
    assert_in_delta 0.4, decision.shared_ratio, 1e-9
    refute policy(min_shared: nil).check(workers(15, 15, shared_mib: 160, parent_mib: 400), now: 0).refork?
  end

  def test_lost_sharing_without_growth_is_not_decay
    refute policy.check(workers(1, 1, shared_mib: 40, parent_mib: 400), now: 0).refork?
  end

  def test_cold_workers_are_not_judged
    decision = policy.check(workers(50, 50, requests: 10), now: 0)
    refute decision.refork?
    assert_equal :cold, decision.reason
    assert policy.check(workers(50, 50, requests: nil), now: 0).refork?, "no request count: judged on memory alone"
  end

  def test_no_workers
    assert_equal :no_workers, policy.check([], now: 0).reason
  end

  def test_needs_the_condition_on_consecutive_checks
    p = Memkit::Refork::Policy.new(confirm: 3)
    assert_equal :confirming, p.check(workers(30, 30), now: 0).reason
    assert_equal :confirming, p.check(workers(30, 30), now: 5).reason
    refute p.check(workers(3, 3), now: 10).refork?, "dipped back: the streak starts again"
    refute p.check(workers(30, 30), now: 15).refork?
    refute p.check(workers(30, 30), now: 20).refork?
    assert p.check(workers(30, 30), now: 25).refork?
  end

  def test_cooldown_after_a_refork_doubles_each_time
    p = policy(cooldown: 60, backoff: 2.0, max_cooldown: 200)
    assert p.check(workers(30, 30), now: 0).refork?
    p.reforked!(now: 0)
    assert_equal :cooldown, p.check(workers(30, 30), now: 59).reason
    assert p.check(workers(30, 30), now: 60).refork?
    p.reforked!(now: 60)
    assert_equal :cooldown, p.check(workers(30, 30), now: 179).reason, "second cooldown is 120 s"
    assert p.check(workers(30, 30), now: 180).refork?
    p.reforked!(now: 180)
    assert_equal 380, p.quiet_until, "third would be 240 s, capped at max_cooldown 200"
    assert_equal 3, p.reforks
  end

  def test_a_streak_does_not_carry_over_a_refork
    p = Memkit::Refork::Policy.new(confirm: 2, cooldown: 0)
    p.check(workers(30, 30), now: 0)
    assert p.check(workers(30, 30), now: 1).refork?
    p.reforked!(now: 1)
    refute p.check(workers(30, 30), now: 2).refork?, "the new generation needs its own confirmation"
    assert p.check(workers(30, 30), now: 3).refork?
  end

  def test_max_reforks
    p = policy(cooldown: 0, max_reforks: 1)
    assert p.check(workers(30, 30), now: 0).refork?
    p.reforked!(now: 0)
    assert_equal :max_reforks, p.check(workers(30, 30), now: 1).reason
  end

  def test_shared_ratio_is_capped_and_safe_for_a_zero_parent
    assert_in_delta 1.0, reading(0, shared_mib: 300, parent_mib: 200).shared_ratio
    assert_in_delta 0.0, reading(0, parent_mib: 0).shared_ratio
  end

  def test_rejects_bad_options_by_name
    { growth: 0, min_shared: 2, min_growth: -1, confirm: 0, cooldown: "1m", backoff: 0.5, max_reforks: -1,
      min_requests: 1.5 }.each do |key, value|
      error = assert_raises(Memkit::InvalidArgument) { Memkit::Refork::Policy.new(key => value) }
      assert_match(/\A#{key}:/, error.message)
    end
    error = assert_raises(Memkit::InvalidArgument) { Memkit::Refork::Policy.new(grwoth: 0.1) }
    assert_match(/grwoth/, error.message)
  end
end
