# frozen_string_literal: true

module Memkit
  class FiberPool
    # FiberPool in Ruby: the reference for NativeCore (ext/memkit/fiber_pool.c)
    # and the core used where that is not built or MEMKIT_NATIVE=0. On Ruby
    # 3.1 every instance-variable access here costs about as much as the
    # fiber switch, which keeps this core near 1.2x a new fiber per job
    # (docs/BENCHMARKS.md); on 3.3+ it is within 10% of the C core.
    class RubyCore < FiberPool
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

      private

      def setup(max_idle, _max)
        @thread = Thread.current
        @hot = nil # the most recently parked fiber, kept out of @idle: cheaper
        @idle = []
        @live = 0
        @args = @storage = nil
        @done = @failed = false
        @keep_hot = max_idle.positive?
        @waiting = nil # {fiber => Thread::Queue} for callers waiting under a scheduler
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
        if @live >= @max
          raise Exhausted,
                "FiberPool: all #{@max} fibers are busy (max: #{@max}): that many jobs are nested or suspended"
        end

        fiber = nil
        fiber = ::Fiber.new do |job|
          thread = Thread.current
          clear_storage if STORAGE # Fiber.new copied its creator's storage
          while true # not `loop do`: that is a block call per job
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
            rescue Exception => e # the caller gets all the job raised, as it would inline
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
      def suspended(fiber, value)
        unless fiber.alive?
          @live -= 1
          raise Error, "FiberPool: a job ended its own fiber (Fiber#kill?) before returning"
        end

        if ::Fiber.scheduler
          if ::Fiber.current.blocking?
            raise Error, "FiberPool: the job is waiting on the Fiber scheduler, but #run was called from a blocking " \
                         "fiber, which cannot wait for it; call #run inside Fiber.schedule { }"
          end
          # The scheduler resumes the job's fiber itself, not us. Wait on a
          # queue, which the scheduler understands, until the job finishes.
          failed, value = ((@waiting ||= {})[fiber] = Thread::Queue.new).pop
          raise value if failed

          return value
        end

        # No scheduler: the job yielded a value to our caller, as an inline
        # Fiber.yield would. Pass it on, and pass the reply back in.
        until @done
          begin
            reply = ::Fiber.yield(value)
          rescue FiberError => e
            # Inline, Fiber.yield from the root fiber raises inside the job.
            value = fiber.raise(e)
            next
          end
          value = fiber.resume(reply)
        end
        @done = false
        if @failed
          @failed = false
          raise value
        end

        value
      end
    end
  end
end
