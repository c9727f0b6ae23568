# frozen_string_literal: true

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
        POOLS.each_value { |pool| pool.__send__(:after_fork) } if pid.zero?
        pid
      end
    end
    private_constant :ForkHook
    Process.singleton_class.prepend(ForkHook)

    attr_reader :max_idle, :max

    def initialize(max_idle: 8, max: 1024)
      @max_idle = integer_option(:max_idle, max_idle, min: 0)
      @max = integer_option(:max, max, min: 1)
      raise InvalidArgument, "FiberPool max_idle (#{max_idle}) must not exceed max (#{max})" if @max_idle > @max

      setup
      POOLS[self] = self
    end

    def busy = size - idle

    def inspect
      "#<#{self.class.name} live=#{size} idle=#{idle} max_idle=#{max_idle} max=#{max}>"
    end

    private

    def integer_option(name, value, min:)
      return value if value.is_a?(Integer) && value >= min

      raise InvalidArgument, "FiberPool #{name}: expected an Integer >= #{min}, got #{value.inspect}"
    end

    def owner!(owner)
      return if Thread.current.equal?(owner)

      raise Error, "FiberPool belongs to #{owner.inspect} and was used from #{Thread.current.inspect}: " \
                   "fibers cannot move between threads, so create one pool per thread"
    end

    def clear_storage
      ::Fiber.current.storage&.each_key { |key| ::Fiber[key] = nil }
    end

    def restore_storage(storage)
      storage.each { |key, value| ::Fiber[key] = value }
    end

    # The job suspended its fiber before finishing. The fiber stays with the
    # job (it is not idle) until the job is done; meanwhile #run waits the way
    # the job would have waited inline.
    #
    # Shared by both cores; what it reads and changes of the pool's state
    # goes through done?, take_failed, lost_fiber and wait_queue.
    def suspended(fiber, value)
      unless fiber.alive?
        lost_fiber
        raise Error, "FiberPool: a job ended its own fiber (Fiber#kill?) before returning"
      end

      if ::Fiber.scheduler
        if ::Fiber.current.blocking?
          raise Error, "FiberPool: the job is waiting on the Fiber scheduler, but #run was called from a blocking " \
                       "fiber, which cannot wait for it; call #run inside Fiber.schedule { }"
        end
        # The scheduler resumes the job's fiber itself, not us. Wait on a
        # queue, which the scheduler understands, until the job finishes.
        failed, value = wait_queue(fiber).pop
        raise value if failed

        return value
      end

      # No scheduler: the job yielded a value to our caller, as an inline
      # Fiber.yield would. Pass it on, and pass the reply back in.
      until done?
        begin
          reply = ::Fiber.yield(value)
        rescue FiberError => e
          # Inline, Fiber.yield from the root fiber raises inside the job.
          value = fiber.raise(e)
          next
        end
        value = fiber.resume(reply)
      end
      raise value if take_failed

      value
    end

    # The pool's state and hot path in Ruby: the reference for, and the
    # fallback when it is not built, the C core in ext/memkit/fiber_pool.c
    # (on Ruby 3.1 every instance-variable access here costs about as much as
    # the fiber switch, which keeps this core near 1.15x a new fiber per job).
    module RubyCore
      # Runs the block with args in a pooled fiber and returns its value, or
      # raises what it raised.
      #
      # The job goes in as resume's one argument and its value comes out as
      # Fiber.yield's; a second resume argument would make Fiber.yield build
      # an array, and `job.call(*args)` with no args still pays for the
      # splat, together a third of a bare switch. Arguments, when there are
      # any, wait in @args. @done (set by the fiber just before it yields
      # back; nested and interleaved jobs clear it before anything else can
      # run) and @failed say what the value is. Identity checks and
      # predicates cost a method call each here, so the flags are plain
      # booleans.
      def run(*args, &job)
        raise InvalidArgument, "FiberPool#run needs a block" unless job

        if (fiber = @hot)
          @hot = nil
        else
          fiber = @idle.pop || spawn
        end
        @args = args unless args.empty?
        @storage = ::Fiber.current.storage if STORAGE
        # Stale only if someone else resumed a suspended job to its end.
        @done = false
        begin
          value = fiber.resume(job)
        rescue FiberError
          raise unless foreign_thread?(fiber)
        end
        if @done
          @done = false
          return value unless @failed

          @failed = false
          raise value
        end
        suspended(fiber, value)
      end

      # Fibers alive now: idle ones plus those running (or suspended in) a job.
      def size = @live

      def idle = @idle.size + (@hot ? 1 : 0)

      private

      def setup
        @thread = Thread.current
        @hot = nil # the most recently parked fiber, kept out of @idle: cheaper
        @idle = []
        @live = 0
        @args = @storage = nil
        @done = @failed = false
        @keep_hot = @max_idle.positive?
        @waiting = nil # {fiber => Thread::Queue} for callers waiting under a scheduler
      end

      # In a fork child: forget the idle fibers copied from the parent; the
      # VM frees their stacks with the objects. Busy ones stay counted: the
      # job that called fork runs in one of them and may finish here. Only
      # the forking thread survives fork, so it becomes the owner.
      def after_fork
        @live -= idle
        @hot = nil
        @idle = []
        @waiting = nil
        @thread = Thread.current
      end

      def done? = @done

      def take_failed
        failed = @failed
        @done = @failed = false
        failed
      end

      def lost_fiber = @live -= 1

      def wait_queue(fiber)
        (@waiting ||= {})[fiber] = Thread::Queue.new
      end

      # Ruby refused to resume the fiber because it belongs to another
      # thread. The fiber never ran: park it again and say what happened.
      def foreign_thread?(fiber)
        return false if Thread.current.equal?(@thread)

        @args = @storage = nil
        @idle.push(fiber)
        owner!(@thread)
      end

      def spawn
        owner!(@thread)
        raise Exhausted, "FiberPool: all #{@max} fibers are busy (max: #{@max}): that many jobs are nested or suspended" if @live >= @max

        fiber = nil
        fiber = ::Fiber.new do |job|
          thread = Thread.current
          clear_storage if STORAGE # Fiber.new copied its creator's storage
          while true # rubocop:disable Style/InfiniteLoop -- no block call per job
            if STORAGE && (storage = @storage)
              @storage = nil
              storage.each { |key, value| ::Fiber[key] = value }
            end
            begin
              if (args = @args)
                @args = nil
                value = job.call(*args)
              else
                value = job.call
              end
            rescue Exception => e # rubocop:disable Lint/RescueException -- the caller gets all the job raised, as inline
              value = e
              @failed = true
            end
            job = args = nil
            keys = thread.keys
            keys.each { |key| thread[key] = nil } unless keys.empty?
            clear_storage if STORAGE
            # Park the fiber (inline: this runs for every job), or let it end.
            if !@hot && @keep_hot
              @hot = fiber
              keep = true
            elsif (keep = @idle.size + 1 < @max_idle)
              @idle.push(fiber)
            else
              @live -= 1
            end
            if @waiting && (queue = @waiting.delete(fiber))
              # Our caller waits on a queue (see #suspended): hand it the
              # outcome there, then yield to whoever resumed us, the scheduler.
              @waiting = nil if @waiting.empty?
              queue.push([@failed, value])
              @failed = false
              break unless keep

              job = ::Fiber.yield
            else
              @done = true
              break value unless keep

              job = ::Fiber.yield(value)
            end
          end
        end
        # Counted once made: Fiber.new fails when the process is out of
        # mappings (vm.max_map_count), and that fiber never lived.
        @live += 1
        fiber
      end
    end

    NATIVE = Native::LOADED && Native.install_fiber_pool(self)
    include RubyCore unless NATIVE
  end
end
