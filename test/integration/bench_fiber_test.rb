# frozen_string_literal: true

require "test_helper"
require "json"

# memkit bench fiber, run small: the report's shape, not its speed.
class BenchFiberTest < Minitest::Test
  def test_json_report_has_every_shape_ratios_and_the_live_fiber_count
    out, err, status = memkit("bench", "fiber", "--rounds", "1", "--jobs", "2000", "--fibers", "300", "--json")
    assert status.success?, err
    report = JSON.parse(out)
    assert_equal RUBY_DESCRIPTION, report["ruby"]
    assert_equal %w[allocate bare new pool reuse switch], report["per_second"].keys.sort
    expected = Memkit::FiberPool::CORE == Memkit::FiberPool::RubyCore ? "ruby" : "c"
    assert_equal expected, report["pool_core"], "the CLI picks the core FiberPool.new picks"
    report["per_second"].each_value { |rate| assert_operator rate, :>, 0 }
    pool, new = report["per_second"].values_at("pool", "new")
    # The rates are rounded to whole jobs per second, the ratio (from the
    # unrounded rates) to 0.01: on 3.4 "pool" ran 307 times the jobs "new" did,
    # and its rounding alone moved the ratio by 0.06.
    ratio = pool.fdiv(new)
    assert_in_delta ratio, report["ratios"]["pool_vs_new"], (ratio * ((0.5 / pool) + (0.5 / new))) + 0.005
    count = report["count"]
    assert_equal 300, count["fibers"]
    # Each suspended fiber holds a stack mapping above a guard page, and at
    # least one page of it is resident.
    assert_operator count["mappings_per_fiber"], :>=, 1.0
    assert_operator count["rss_per_fiber"], :>=, 4096
    assert_operator count["address_space_per_fiber"], :>=, RubyVM::DEFAULT_PARAMS[:fiber_machine_stack_size]
  end

  def test_text_report_prints_ratios_and_rejects_bad_options
    out, err, status = memkit("bench", "fiber", "--rounds", "1", "--jobs", "1000", "--fibers", "100")
    assert status.success?, err
    assert_match(%r{^pool/new \d+\.\d+x   bare/new \d+\.\d+x}, out)
    assert_match(/^vm.max_map_count #{File.read('/proc/sys/vm/max_map_count').to_i} allows about \d+ live fibers/, out)
    _out, err, status = memkit("bench", "fiber", "--rounds", "0")
    assert_equal 2, status.exitstatus
    assert_match(/positive/, err)
  end

  def test_core_option_picks_the_pools_core
    out, err, status = memkit(*%w[bench fiber --rounds 1 --jobs 500 --fibers 50 --core ruby --json])
    assert status.success?, err
    assert_equal "ruby", JSON.parse(out)["pool_core"]
    _out, err, status = Open3.capture3({ "MEMKIT_NATIVE" => "0" }, RbConfig.ruby, Memkit::TestHelpers::EXE,
                                       "bench", "fiber", "--core", "c", "--rounds", "1")
    assert_equal 2, status.exitstatus
    assert_equal ["memkit: --core c: ext/memkit is not built for this Ruby, or MEMKIT_NATIVE=0 is set " \
                  "(see memkit bench --help)\n"], err.lines
  end

  def test_the_library_raises_its_own_errors_naming_keywords
    require "memkit/bench/fiber"
    error = assert_raises(Memkit::InvalidArgument) { Memkit::Bench::Fiber.new(rounds: 0) }
    assert_match(/rounds: expected a positive Integer, got 0/, error.message)
    refute_kind_of Memkit::CLI::UsageError, error if defined?(Memkit::CLI::UsageError)
    assert_raises(Memkit::InvalidArgument) { Memkit::Bench::Fiber.new(core: "go") }
    report = Memkit::Bench::Fiber.new(rounds: 1, jobs: 200, fibers: 20, core: "ruby").run
    assert_equal "ruby", report[:pool_core]
    assert_equal 20, report[:count][:fibers]
  end
end
