# frozen_string_literal: true

require "test_helper"
require "objspace"
require "json"

class WarmupTest < Minitest::Test
  def setup
    Memkit::Warmup.reset!
  end

  def test_first_run_promotes_young_objects_and_reports
    kept = Array.new(50_000) { Object.new }
    refute old?(kept.last), "a new object starts young"

    report = Memkit.warmup
    refute report.skipped
    assert_equal :first, report.reason
    assert report.duration >= 0
    assert report.gc_runs >= 1
    assert report.young_before > report.young_after, report.to_h.inspect
    assert old?(kept.last), "warmup leaves surviving objects old"
    if Process.respond_to?(:warmup)
      assert_equal %i[process_warmup], report.steps - [:malloc_release], "on 3.3+ the heap steps are the built-in's"
    else
      assert_includes report.steps, :promote
      assert_includes report.steps, :coderange
      refute_includes report.steps, :fill, "the object-slot fill runs only when asked for"
      assert_includes report.steps, :fill_malloc, "memkit's own steps fill the malloc holes by default"
    end
    %i[slots_freed pages_freed].each { |key| assert_kind_of Integer, report[key] }
    assert_kind_of Integer, report.bytes_trimmed
  end

  def test_second_run_with_nothing_changed_is_a_no_op
    Memkit.warmup
    count = GC.count
    report = Memkit.warmup
    assert report.skipped
    assert_equal :unchanged, report.reason
    assert_equal count, GC.count, "a skipped warmup must not run the GC"
    assert_equal [], report.steps
  end

  def test_a_small_change_gets_a_touch_up_and_a_large_one_the_whole_sequence
    Memkit.warmup(threshold: 1_000)
    kept = Array.new(5_000) { +"x" } # far fewer than 10% of the live objects
    report = Memkit.warmup(threshold: 1_000)
    refute report.skipped
    assert_equal :changed_little, report.reason
    assert_equal [:touch_up], report.steps
    assert old?(kept.last), "the touch-up ages the new objects"

    more = Array.new(GC.stat(:heap_live_slots) / 5) { Object.new }
    report = Memkit.warmup(threshold: 1_000)
    assert_equal :changed, report.reason
    assert_includes report.steps, Process.respond_to?(:warmup) ? :process_warmup : :promote
    assert old?(more.last)

    forced = Memkit.warmup(force: true)
    refute forced.skipped
    assert_equal :forced, forced.reason
  end

  def test_gc_disabled_state_is_preserved
    GC.disable
    report = Memkit.warmup(force: true)
    refute report.skipped
    assert_equal true, GC.enable, "GC must still be disabled after warmup"
    assert_equal false, GC.disable, "and enabled stays enabled"
  ensure
    GC.enable
  end

  def test_each_step_can_be_turned_off
    report = Memkit.warmup(force: true, process_warmup: false, promote: false, coderange: false,
                           compact: false, trim: false, fill: false, malloc_release: false)
    assert_equal [], report.steps
    assert_equal 1, report.gc_runs, "only the final full GC"

    report = Memkit.warmup(force: true, process_warmup: false, compact: false, trim: false, fill: false,
                           malloc_release: false)
    assert_equal %i[promote coderange], report.steps
  end

  def test_fill_runs_only_when_asked_and_reports_what_it_filled
    report = Memkit.warmup(force: true, fill: true)
    assert_includes report.steps, :fill
    assert_kind_of Integer, report.slots_filled
    assert_kind_of Integer, report.bytes_filled
    refute_includes Memkit.warmup(force: true).steps, :fill
  end

  # fill: :malloc fills only the malloc arena's free chunks: what a child
  # forked afterwards would otherwise malloc into, copying the page each sits in.
  def test_fill_malloc_fills_the_arenas_holes_and_no_object_slots
    in_fresh_process { fill_malloc_fills_the_arenas_holes_and_no_object_slots }
  end

  def fill_malloc_fills_the_arenas_holes_and_no_object_slots
    report = Memkit.warmup(force: true, fill: :malloc)
    assert_includes report.steps, :fill_malloc
    refute_includes report.steps, :fill
    assert_equal 0, report.slots_filled
    assert_kind_of Integer, report.bytes_filled
    skip "no glibc mallinfo2 here: nothing to fill" unless Memkit::Libc.malloc_trim? && Memkit::Libc.mallinfo2

    holes = lambda do
      info = Memkit::Libc.mallinfo2
      info.fordblks - info.keepcost # free bytes outside the top chunk
    end
    # Holes of many sizes: every other string of a set freed. mallinfo2 sums
    # every arena, and threads keep arenas of their own that the main
    # thread's mallocs never reach: so the test counts the holes it made,
    # and wants the fill to take them. In a fresh process, because threads
    # other tests started free into their arenas while it counts (in one 3.4
    # run the holes "made" came to -893,920 bytes).
    GC.start(full_mark: true, immediate_sweep: true)
    base = holes.call
    strings = Array.new(4_000) { |i| "x" * (700 + (i % 50) * 40) }
    strings.each_index { |i| strings[i] = nil if i.odd? }
    GC.start(full_mark: true, immediate_sweep: true)
    before = holes.call
    made = before - base
    assert made > 1_000_000, "freeing every other string made only #{made} bytes of holes"
    Memkit.warmup(force: true, process_warmup: false, compact: false, trim: false, fill: :malloc)
    after = holes.call
    assert before - after > made / 2,
           "free bytes outside the top chunk: #{before} before the fill (#{made} made here), #{after} after"
  end

  def test_compact_and_trim_where_available
    skip "no GC.compact on this Ruby" unless GC.respond_to?(:compact)

    report = Memkit.warmup(force: true, process_warmup: false, compact: true)
    assert_includes report.steps, :compact
    if Memkit::Warmup.malloc_trim_available?
      assert_includes report.steps, :trim
      assert report.bytes_trimmed >= 0
    end
  end

  def test_invalid_options_raise_invalid_argument
    [{ speed: 1 }, { force: "yes" }, { threshold: -1 }, { max_gcs: 1.5 }, { compact: :maybe },
     { fill: :objects }].each do |opts|
      error = assert_raises(Memkit::InvalidArgument, opts.inspect) { Memkit.warmup(**opts) }
      assert_match(/#{opts.keys.first}/, error.message)
    end
    return if Process.respond_to?(:warmup)

    assert_raises(Memkit::InvalidArgument) { Memkit.warmup(process_warmup: true) }
  end

  def test_concurrent_calls_from_threads_do_the_work_once
    Array.new(20_000) { Object.new }.tap { |a| $warmup_test_keep = a }
    reports = Array.new(4) { Thread.new { Memkit.warmup } }.map(&:value)
    assert_equal 1, reports.count { |r| !r.skipped }, reports.map(&:reason).inspect
  ensure
    $warmup_test_keep = nil
  end

  # The reason the coderange step exists, measured: a child asking shared
  # strings for their encoding properties writes to their headers unless
  # the parent already did.
  def test_coderange_step_keeps_string_checks_in_the_child_from_dirtying_pages
    skip "needs /proc/PID/smaps_rollup" unless linux?

    without = child_dirty_after_string_checks(coderange: false)
    skip "this Ruby already knew the strings' coderange (#{without} bytes dirtied)" if without < 1 << 20
    with = child_dirty_after_string_checks(coderange: true)
    assert with * 4 < without, "private dirty growth: with coderange #{with}, without #{without}"
  end

  # fill: :auto fills the object slots only where the app's typical request
  # would start a worker's GC from malloc long before the free slots run out,
  # on a heap of one slot size (Ruby 3.1).
  def test_auto_fills_slots_where_the_warmup_forecasts_a_malloc_started_gc
    keep = Array.new(20_000) { Object.new } # some heap, so that free slots exist
    malloc_heavy = ->(_env) { [200, {}, ["x" * 2_000_000]] } # 2 MB malloc'd, a handful of objects
    report = Memkit.warmup(force: true, app: malloc_heavy, requests: Array.new(6) { "/" })
    forecast = report.gc_forecast
    refute_nil forecast, report.to_h.inspect
    assert forecast[:slots_outlast_malloc], forecast.inspect
    assert_operator forecast[:requests_until_slots_run_out], :>, forecast[:requests_until_malloc_gc]
    if GC.respond_to?(:stat_heap) && GC.stat_heap.size > 1
      refute_includes report.steps, :fill, "several slot sizes: the Object fillers would fill only the smallest"
    else
      assert_includes report.steps, :fill
      assert_operator report.slots_filled, :>, 0
    end
    keep.clear
  end

  def test_auto_leaves_the_slots_to_an_app_whose_requests_allocate_many_objects
    # 50,000 objects a request (and their 400 KB array), measured without a
    # GC in the middle, which would leave the malloc reading unknown.
    object_heavy = lambda do |_env|
      GC.disable
      [200, {}, [Array.new(50_000) { |i| i.to_s }.size.to_s]]
    ensure
      GC.enable
    end
    report = Memkit.warmup(force: true, app: object_heavy, requests: Array.new(4) { "/" })
    forecast = report.gc_forecast
    refute_nil forecast, report.to_h.inspect
    refute forecast[:slots_outlast_malloc], forecast.inspect
    refute_includes report.steps, :fill, "the free slots are the workers' working space here"
  end

  # Readings measured on the two bench apps (3.1, after memkit's steps).
  def test_gc_forecast_compares_the_free_slots_with_the_malloc_budget
    app_shape = Memkit::Warmup.gc_forecast({ objects: 59, malloc_bytes: 31_800 },
                                           free_slots: 167_289, malloc_limit: 29_723_936)
    assert_equal 2835, app_shape[:requests_until_slots_run_out]
    assert_equal 934, app_shape[:requests_until_malloc_gc]
    assert app_shape[:slots_outlast_malloc], "few objects, much malloc: GCs start from malloc"

    rails = Memkit::Warmup.gc_forecast({ objects: 5261, malloc_bytes: 16_152 },
                                       free_slots: 74_914, malloc_limit: 16_777_216)
    refute rails[:slots_outlast_malloc], "many objects a request: the free slots run out first"

    frees_as_much = Memkit::Warmup.gc_forecast({ objects: 5261, malloc_bytes: -800 },
                                               free_slots: 10_000_000, malloc_limit: 16_777_216)
    assert_nil frees_as_much[:requests_until_malloc_gc], "a net malloc <= 0 never starts a GC"
    refute frees_as_much[:slots_outlast_malloc]

    assert_nil Memkit::Warmup.gc_forecast(nil, free_slots: 1, malloc_limit: 1)
  end

  def test_auto_without_app_warmup_has_no_forecast_and_fills_no_slots
    report = Memkit.warmup(force: true)
    assert_nil report.gc_forecast
    refute_includes report.steps, :fill
  end

  private

  def old?(object)
    JSON.parse(ObjectSpace.dump(object)).dig("flags", "old") == true
  end

  def child_dirty_after_string_checks(coderange:)
    code = <<~RUBY
      require "memkit"
      $s = Array.new(200_000) { |i| (format("%018d", i).b << "\\xC3\\xA9".b * 6).force_encoding(Encoding::UTF_8) }
      Memkit.warmup(force: true, process_warmup: false, compact: false, coderange: #{coderange})
      r, w = IO.pipe
      pid = fork do
        before = Memkit.memory.private_dirty
        $s.each(&:ascii_only?)
        w.puts(Memkit.memory.private_dirty - before)
        exit!(0)
      end
      w.close
      puts r.read
      Process.wait(pid)
    RUBY
    out, err, status = Open3.capture3(RbConfig.ruby, "-I", File.join(ROOT, "lib"), "-e", code)
    assert status.success?, err
    Integer(out.strip)
  end

end
