# frozen_string_literal: true

require_relative "errors"
require_relative "native"

module Memkit
  # Runs jobs in reused fibers.
  #
  # Since Ruby 2.7 the VM keeps finished fibers' stacks in its own pool, so
  # `Fiber.new { job }.resume` is already cheap; what is left to save is
  # creating the Fiber object, its VM context and its first frame for every
  # job. A FiberPool keeps a few fibers parked in a loop and hands each job to
  # one of them.
  #
  #   pool = Memkit::FiberPool.new(max_idle: 8, max: 1024)
  #   pool.run(request) { |req| handle(req) }   # => the block's value
  #
  # What a job sees is what it would see in a fresh fiber:
  # * an exception raised by the job is re-raised by #run (with the job's
  #   backtrace), and the fiber goes back to the pool;
  # * fiber-locals (Thread.current[:x] is per fiber) start empty and are
  #   cleared when the job ends, so they never reach the next job;
  # * Fiber storage (Fiber[:x], Ruby 3.2+) starts as a copy of the caller's,
  #   as Fiber.new gives it, and is cleared when the job ends;
  # * a job that suspends its fiber (a Fiber scheduler waiting for IO or a
  #   sleep, or an explicit Fiber.yield) keeps that fiber until it finishes.
  #
  # A pool belongs to the thread that created it (a fiber cannot be resumed
  # from another thread: #run raises Memkit::Error) and to its process: a
  # forked child drops the idle fibers it inherited and makes its own.
  #
  # `max` bounds live fibers (idle plus busy). One thread needs more than one
  # fiber only while jobs nest or stay suspended, so running out means `max`
  # jobs are suspended at once: #run raises FiberPool::Exhausted instead of
  # blocking, because nothing on this thread could free a fiber while it
  # waited. Fibers beyond `max_idle` end when their job does.
  #
  # Two implementations, chosen once when this file loads (the way io-event
  # picks its selector): FiberPool::NativeCore in C (ext/memkit) when it is
  # built, else FiberPool::RubyCore. MEMKIT_NATIVE=0 in the environment
  # forces the Ruby core. FiberPool.new returns an instance of FiberPool::CORE;
  # both cores are FiberPools and can be made directly.
  class FiberPool
    # Raised by #run when `max` fibers are busy.
    class Exhausted < Error; end

    # Fiber storage (Fiber[] / Fiber#storage) exists from Ruby 3.2.
    STORAGE = ::Fiber.respond_to?(:[])

    # Every pool, weakly, so that a fork child can make each drop the fibers
    # it copied from its parent.
    POOLS = ObjectSpace::WeakMap.new
    private_constant :POOLS

    # Process._fork (Ruby 3.1+) is the hook Ruby provides for libraries that
    # must notice fork. Checking Process.pid in #run instead would cost a
    # getpid syscall on every job, about as much as the fiber switch itself.
    module ForkHook
      def _fork
        pid = super
        POOLS.each_value(&:after_fork) if pid.zero?
        pid
      end
    end
    private_constant :ForkHook
    Process.singleton_class.prepend(ForkHook)

    # FiberPool.new(...) makes a pool on the chosen core; a core's own .new
    # makes one of that core.
    def self.new(...)
      equal?(FiberPool) ? CORE.new(...) : super
    end

    attr_reader :max_idle, :max

    def initialize(max_idle: 8, max: 1024)
      @max_idle = integer_option(:max_idle, max_idle, min: 0)
      @max = integer_option(:max, max, min: 1)
      raise InvalidArgument, "FiberPool max_idle (#{max_idle}) must not exceed max (#{max})" if @max_idle > @max

      setup(@max_idle, @max)
      POOLS[self] = self
    end

    def busy = size - idle

    def inspect
      "#<#{self.class.name} live=#{size} idle=#{idle} max_idle=#{max_idle} max=#{max}>"
    end

    # Each core defines #run, #size, #idle, and #after_fork: in a fork
    # child, forget the idle fibers copied from the parent (memkit's
    # Process._fork hook calls it; call it yourself only in a child made
    # without Process._fork, e.g. by a C extension's fork()).

    private

    def integer_option(name, value, min:)
      return value if value.is_a?(Integer) && value >= min

      raise InvalidArgument, "FiberPool #{name}: expected an Integer >= #{min}, got #{value.inspect}"
    end
  end
end

require_relative "fiber_pool/ruby_core"

module Memkit
  class FiberPool
    # Why C (ext/memkit/fiber_pool.c): on Ruby 3.1 the C core runs a job
    # 1.87x as fast as a new fiber per job, the Ruby core 1.24x, and the
    # goal is 1.5x (docs/BENCHMARKS.md, "FiberPool"). On 3.3+ both pass it.
    # The C file defines FiberPool::NativeCore when asked, and only then.
    CORE = Native::LOADED ? Native.define_fiber_pool_core(self) : RubyCore
  end
end
