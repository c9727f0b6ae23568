# frozen_string_literal: true

require "test_helper"
require "fileutils"
require "open3"
require "tmpdir"
require "memkit/fiber_pool"

# What every FiberPool core must do. Included below into one test class per
# core, each making its core's pools directly (FiberPool::RubyCore.new,
# FiberPool::NativeCore.new), whichever FiberPool.new would pick.
module FiberPoolContract
  # A minimal Fiber scheduler: sleeping and blocking fibers wait in tables,
  # #run resumes them when due or unblocked. Enough for Kernel#sleep and
  # Thread::Queue, which is all these tests need.
  class TinyScheduler
    attr_reader :log

    def initialize
      @sleeping = {}
      @blocked = {}
      @ready = Thread::Queue.new
    end

    def fiber(&block)
      fiber = Fiber.new(blocking: false, &block)
      fiber.resume
      fiber
    end

    def kernel_sleep(duration = nil)
      @sleeping[Fiber.current] = duration ? now + duration : Float::INFINITY
      Fiber.yield
      true
    end

    def block(_blocker, timeout = nil)
      @blocked[Fiber.current] = timeout ? now + timeout : Float::INFINITY
      Fiber.yield
      true
    end

    def unblock(_blocker, fiber)
      @ready.push(fiber)
    end

    def io_wait(_io, _events, _timeout)
      raise NotImplementedError, "TinyScheduler does no IO"
    end

    def close
      run
    end

    def run
      until @sleeping.empty? && @blocked.empty? && @ready.empty?
        until @ready.empty?
          fiber = @ready.pop
          @blocked.delete(fiber)
          fiber.resume if fiber.alive?
        end
        due = @sleeping.select { |_, at| at <= now }.keys
        due.each do |fiber|
          @sleeping.delete(fiber)
          fiber.resume if fiber.alive?
        end
        stuck = due.empty? && @ready.empty? && @sleeping.empty? && !@blocked.empty? &&
                @blocked.values.all?(Float::INFINITY)
        raise "TinyScheduler: every fiber is blocked forever" if stuck

        Kernel.sleep(0.001) if @ready.empty?
      end
    end

    private

    def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end

  def setup
    @pool = pool_class.new(max_idle: 4, max: 8)
  end

  def test_a_pool_is_a_fiber_pool_of_its_core
    assert_instance_of pool_class, @pool
    assert_kind_of Memkit::FiberPool, @pool
    assert_match(/\A#<#{pool_class.name} live=0 idle=0 max_idle=4 max=8>\z/, @pool.inspect)
  end

  def test_returns_the_blocks_value_and_passes_arguments
    assert_equal 5, @pool.run(2, 3) { |a, b| a + b }
    assert_equal [], @pool.run { |*args| args }
    assert_equal [1, [2, 3]], @pool.run(1, [2, 3]) { |a, b| [a, b] }
  end

  def test_jobs_run_in_one_reused_fiber_that_is_not_the_callers
    fibers = 3.times.map { @pool.run { Fiber.current } }
    refute_same Fiber.current, fibers.first
    assert_equal 1, fibers.uniq.size
    assert_equal 1, @pool.size
    assert_equal 1, @pool.idle
  end

  def test_the_jobs_exception_is_raised_in_the_caller_and_the_fiber_stays_usable
    used = @pool.run { Fiber.current }
    error = assert_raises(KeyError) { @pool.run { {}.fetch(:missing) } }
    assert_match(/missing/, error.message)
    assert(error.backtrace.any? { |line| line.include?(__FILE__) })
    assert_same used, @pool.run { Fiber.current }, "the fiber that raised is reused"
    assert_equal 1, @pool.size

    # Not only StandardError: whatever the job raises reaches the caller.
    assert_raises(Interrupt) { @pool.run { raise Interrupt } }
    assert_equal :fine, @pool.run { :fine }
  end

  def test_fiber_locals_do_not_leak_from_one_job_to_the_next
    first = @pool.run do
      Thread.current[:user] = "alice"
      Thread.current[:request_id] = 42
      Fiber.current
    end
    seen, fiber = @pool.run { [[Thread.current[:user], Thread.current[:request_id]], Fiber.current] }
    assert_same first, fiber, "same fiber, so the locals were cleared rather than left behind in another fiber"
    assert_equal [nil, nil], seen
    assert_empty @pool.run { Thread.current.keys }
    # The caller's own fiber-locals are its own, as with Fiber.new.
    Thread.current[:caller_only] = 1
    assert_nil @pool.run { Thread.current[:caller_only] }
  ensure
    Thread.current[:caller_only] = nil
  end

  def test_fiber_locals_are_cleared_after_a_failing_job_too
    assert_raises(RuntimeError) { @pool.run { Thread.current[:x] = 1; raise "no" } }
    assert_nil @pool.run { Thread.current[:x] }
  end

  def test_fiber_storage_is_the_callers_copy_and_does_not_leak
    skip "Fiber storage (Fiber[]) needs Ruby 3.2+" unless Fiber.respond_to?(:[])

    Fiber[:tenant] = "acme"
    seen = @pool.run do
      value = Fiber[:tenant]
      Fiber[:tenant] = "changed"
      Fiber[:leak] = 1
      value
    end
    assert_equal "acme", seen, "a job sees the caller's storage, as Fiber.new would give it"
    assert_equal "acme", Fiber[:tenant], "the job changed its copy only"
    Fiber[:tenant] = nil
    assert_equal [nil, nil], @pool.run { [Fiber[:tenant], Fiber[:leak]] }
  ensure
    Fiber[:tenant] = nil if Fiber.respond_to?(:[])
  end

  def test_a_pool_refuses_other_threads
    @pool.run { 1 } # an idle fiber made by this thread
    error = Thread.new { @pool.run { :never } rescue $! }.value
    assert_kind_of Memkit::Error, error
    assert_match(/belongs to .*used from/, error.message)
    empty = pool_class.new
    error = Thread.new { empty.run { :never } rescue $! }.value
    assert_kind_of Memkit::Error, error
    assert_equal 2, @pool.run { 2 }, "still usable by its own thread"
    assert_equal 1, @pool.size
  end

  def test_a_fork_child_does_not_resume_its_parents_fibers
    parent_fiber = @pool.run { Fiber.current }
    assert_equal 1, @pool.idle
    reader, writer = IO.pipe
    pid = fork do
      reader.close
      before = [@pool.idle, @pool.size]
      fiber = @pool.run { Fiber.current }
      writer.write(Marshal.dump([before, fiber.equal?(parent_fiber), @pool.size, @pool.run { :ok }]))
      writer.close
      exit!(0)
    end
    writer.close
    before, same, size, value = Marshal.load(reader.read)
    Process.wait(pid)
    assert_equal [0, 0], before, "the child dropped the idle fiber it inherited"
    refute same, "the child ran its job in a fiber of its own"
    assert_equal 1, size
    assert_equal :ok, value
    assert_same parent_fiber, @pool.run { Fiber.current }, "the parent keeps its fiber"
  ensure
    reader&.close
  end

  def test_max_bounds_live_fibers_with_a_clear_error
    pool = pool_class.new(max_idle: 1, max: 3)
    nest = ->(depth) { depth.zero? ? :bottom : pool.run { nest.(depth - 1) } }
    assert_equal :bottom, nest.(3)
    error = assert_raises(Memkit::FiberPool::Exhausted) { nest.(4) }
    assert_kind_of Memkit::Error, error
    assert_match(/max: 3/, error.message)
    assert_equal 1, pool.size, "fibers beyond max_idle ended once their jobs did"
    assert_equal :bottom, nest.(3), "usable again"
  end

  def test_idle_fibers_beyond_max_idle_are_released
    pool = pool_class.new(max_idle: 2, max: 10)
    nest = ->(depth) { depth.zero? ? pool.busy : pool.run { nest.(depth - 1) } }
    assert_equal 6, nest.(6), "six jobs nested: six busy fibers"
    assert_equal 2, pool.idle
    assert_equal 2, pool.size
    none = pool_class.new(max_idle: 0, max: 1)
    fibers = 2.times.map { none.run { Fiber.current } }
    refute_same fibers[0], fibers[1]
    assert_equal 0, none.size
  end

  def test_a_job_yielding_to_a_consumer_keeps_its_fiber_until_done
    consumer = Fiber.new do
      @pool.run do
        mine = Fiber.current
        Fiber.yield :first
        Fiber.yield :second
        [:done, mine]
      end
    end
    assert_equal :first, consumer.resume
    assert_equal 1, @pool.busy
    # Another job meanwhile gets a different fiber.
    other = @pool.run { Fiber.current }
    assert_equal :second, consumer.resume
    done, mine = consumer.resume
    assert_equal :done, done
    refute_same mine, other
    assert_equal 0, @pool.busy
    assert_equal 2, @pool.idle
  end

  def test_a_job_finished_by_someone_else_does_not_confuse_the_next_one
    captured = nil
    first = Fiber.new { @pool.run { captured = Fiber.current; Fiber.yield(:paused); :finished } }
    assert_equal :paused, first.resume
    assert_equal :finished, captured.resume, "a third party ran the job to its end"
    second = Fiber.new { @pool.run { Fiber.yield(:again); :second } }
    assert_equal :again, second.resume
    assert_equal :second, second.resume, "the second job's own Fiber.yield was not taken for its end"
  end

  def test_a_job_yielding_from_the_root_fiber_gets_fibers_error_inside_the_job
    seen = @pool.run do
      Fiber.yield :nowhere
    rescue FiberError => e
      [:rescued_in_job, e.class]
    end
    assert_equal [:rescued_in_job, FiberError], seen
    assert_raises(FiberError) { @pool.run { Fiber.yield } }
    assert_equal 1, @pool.run { 1 }
    assert_equal 0, @pool.busy
  end

  def test_jobs_waiting_on_a_fiber_scheduler_keep_their_fibers_until_done
    log = []
    results = {}
    pool = nil
    Thread.new do
      pool = pool_class.new(max_idle: 4, max: 8)
      Fiber.set_scheduler(TinyScheduler.new)
      3.times do |i|
        Fiber.schedule do
          results[i] = pool.run(i) do |n|
            mine = Fiber.current
            log << [:start, n]
            sleep 0.01 # the scheduler resumes this fiber, not the caller
            log << [:finish, n]
            [n * 10, mine, Fiber.current]
          end
        end
      end
      log << [:scheduled, pool.busy]
      Fiber.set_scheduler(nil) # runs the scheduler until every fiber is done
    end.join(30) or flunk "scheduler thread did not finish"

    assert_equal [[:start, 0], [:start, 1], [:start, 2], [:scheduled, 3]], log.first(4),
                 "all three jobs were suspended in their own fibers at once"
    assert_equal [[:finish, 0], [:finish, 1], [:finish, 2]], log.last(3).sort
    assert_equal [0, 10, 20], results.keys.sort.map { |i| results[i][0] }, "each caller got its own job's value"
    fibers = results.values.map { |_, mine, _| mine }
    assert_equal 3, fibers.uniq.size
    results.each_value { |_, mine, after| assert_same mine, after, "the job resumed in the fiber it started in" }
    assert_equal 0, pool.busy
    assert_equal 3, pool.idle
  end

  def test_errors_from_jobs_under_a_scheduler_reach_their_callers
    outcome = nil
    pool = nil
    Thread.new do
      pool = pool_class.new
      Fiber.set_scheduler(TinyScheduler.new)
      Fiber.schedule do
        outcome = begin
          pool.run do
            sleep 0.01
            raise ArgumentError, "after sleeping"
          end
        rescue ArgumentError => e
          e.message
        end
      end
      Fiber.set_scheduler(nil)
    end.join(30) or flunk "scheduler thread did not finish"
    assert_equal "after sleeping", outcome
    assert_equal 1, pool.idle
  end

  # The C core keeps fibers, arguments and queues in a struct the GC must see
  # and must not move (Memkit.warmup compacts the heap).
  def test_survives_gc_stress_and_compaction_between_jobs
    pool = pool_class.new(max_idle: 2, max: 8)
    outer = pool.run(:a) { |x| [x, pool.run(:b) { |y| [y, pool.run { :c }] }] }
    GC.compact if GC.respond_to?(:compact)
    GC.stress = true
    # Under GC.stress every allocation runs a full GC of the test process's
    # heap: a few jobs are enough.
    results = Array.new(5) { |i| pool.run(i, "s#{i}") { |n, s| "#{s}:#{n * 2}" } }
    error = assert_raises(RuntimeError) { pool.run { raise "boom" } }
    GC.stress = false
    GC.compact if GC.respond_to?(:compact)
    assert_equal [:a, [:b, :c]], outer
    assert_equal Array.new(5) { |i| "s#{i}:#{i * 2}" }, results
    assert_equal "boom", error.message
    assert_equal 7, pool.run { 7 }
    assert_equal 2, pool.idle
  ensure
    GC.stress = false
  end

  def test_invalid_options_and_missing_block
    assert_raises(Memkit::InvalidArgument) { pool_class.new(max_idle: -1) }
    assert_raises(Memkit::InvalidArgument) { pool_class.new(max: 0) }
    assert_raises(Memkit::InvalidArgument) { pool_class.new(max: "8") }
    error = assert_raises(Memkit::InvalidArgument) { pool_class.new(max_idle: 9, max: 8) }
    assert_match(/max_idle.*max/, error.message)
    assert_raises(Memkit::InvalidArgument) { @pool.run }
  end
end

class FiberPoolRubyCoreTest < Minitest::Test
  include FiberPoolContract

  def pool_class = Memkit::FiberPool::RubyCore
end

class FiberPoolNativeCoreTest < Minitest::Test
  include FiberPoolContract

  def setup
    skip "ext/memkit is not built for this Ruby (rake compile), or MEMKIT_NATIVE=0" unless Memkit::Native::LOADED
    super
  end

  def pool_class = Memkit::FiberPool::NativeCore

  def test_its_methods_are_c_methods
    %i[run size idle after_fork].each do |name|
      assert_nil pool_class.instance_method(name).source_location, "NativeCore##{name} should be C"
    end
  end
end

# Which core Memkit::FiberPool.new picks, once.
class FiberPoolCoreTest < Minitest::Test
  def built?
    !Dir[File.join(Memkit::TestHelpers::ROOT, "lib/memkit", RbConfig::CONFIG["ruby_version"], "memkit_native.*")].empty?
  end

  def test_the_c_core_is_picked_when_built
    skip "ext/memkit is not built for this Ruby (rake compile)" unless built?
    skip "MEMKIT_NATIVE=0 is set for this run" if ENV["MEMKIT_NATIVE"] == "0"

    assert_equal Memkit::FiberPool::NativeCore, Memkit::FiberPool::CORE
    assert_instance_of Memkit::FiberPool::NativeCore, Memkit::FiberPool.new
  end

  def core_in_child(lib, env = {})
    script = 'require "memkit"; pool = Memkit::FiberPool.new; ' \
             "p [Memkit::FiberPool::CORE, pool.class, defined?(Memkit::FiberPool::NativeCore), " \
             "pool.run(2) { |x| x * 21 }]"
    clean = { "RUBYOPT" => nil, "RUBYLIB" => nil, "MEMKIT_NATIVE" => nil }
    out, status = Open3.capture2e(clean.merge(env), RbConfig.ruby, "--disable-gems", "-I", lib, "-e", script)
    assert status.success?, out
    out
  end

  def test_a_subclass_of_a_core_is_a_pool_and_of_the_base_class_is_an_error
    mine = Class.new(Memkit::FiberPool::CORE)
    assert_equal 6, mine.new.run { 6 }
    error = assert_raises(NotImplementedError) { Class.new(Memkit::FiberPool).new }
    assert_match(/not a FiberPool core/, error.message)
  end

  def test_memkit_native_0_forces_the_ruby_core
    lib = File.join(Memkit::TestHelpers::ROOT, "lib")
    expected = "[Memkit::FiberPool::RubyCore, Memkit::FiberPool::RubyCore, nil, 42]\n"
    assert_equal expected, core_in_child(lib, "MEMKIT_NATIVE" => "0")
    return unless built?

    native = "[Memkit::FiberPool::NativeCore, Memkit::FiberPool::NativeCore, \"constant\", 42]\n"
    assert_equal native, core_in_child(lib)
  end

  def test_without_the_c_core_memkit_falls_back_to_the_ruby_core
    Dir.mktmpdir do |dir|
      FileUtils.cp_r(File.join(Memkit::TestHelpers::ROOT, "lib"), dir)
      Dir[File.join(dir, "lib/memkit/*/memkit_native.*")].each { |f| File.delete(f) }
      ruby = "[Memkit::FiberPool::RubyCore, Memkit::FiberPool::RubyCore, nil, 42]\n"
      assert_equal ruby, core_in_child(File.join(dir, "lib"))
    end
  end
end
