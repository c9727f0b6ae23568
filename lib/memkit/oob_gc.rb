# frozen_string_literal: true

require_relative "after_reply"

module Memkit
  # Rack middleware that runs garbage collection between requests, when the
  # heap says the next request would otherwise pay for it.
  #
  #   use Memkit::OobGC
  #
  # After each response has been sent (rack.after_reply on Unicorn, Puma and
  # Pitchfork; rack.response_finished on other Rack 3 servers; the body's
  # close elsewhere) it compares what one request allocates with what the heap
  # has left before Ruby would collect on its own:
  #
  # * free object slots (plus pages Ruby may still add without collecting),
  #   per size pool where Ruby has them (3.2+), since any pool running dry
  #   starts a GC;
  # * malloc_increase_bytes against malloc_increase_bytes_limit;
  # * old_objects against old_objects_limit, oldmalloc_increase_bytes against
  #   its limit, and latest_gc_info(:need_major_by), which make the next GC a
  #   major one.
  #
  # If the next request would cross one of them it runs that GC now: minor when
  # a minor would be enough, major when Ruby would do a major anyway. On Ruby
  # 3.1 a new worker's first GCs are left to Ruby, which sizes a growing heap
  # from them (see #settled?).
  #
  # It counts only when no request is in flight in this process, so GCs
  # started by a Puma thread while another thread serves a request are not
  # called out of band (and are not run: it waits for an idle moment).
  #
  # On Puma, add the out_of_band hook (`plugin :memkit` does it):
  #
  #   out_of_band { Memkit::OobGC.out_of_band }
  #
  # Puma runs that hook once all the worker's threads are idle and accepts no
  # connection until it returns, so a request that arrives during the GC goes
  # to another worker instead of waiting in this one's queue. Once the hook
  # has run in a worker, the middleware leaves to it every GC the next request
  # could still do without.
  class OobGC
    # Process-wide counters: GC is process-wide, so are the figures about it.
    # oob_hook: how many of the out-of-band runs Puma's out_of_band hook made.
    # watched: GC runs left to Ruby while a new worker's heap settled (see
    # #settled?); those inside requests are in inside_* too.
    Stats = Struct.new(:requests, :oob_minor, :oob_major, :inside_minor, :inside_major,
                       :oob_seconds, :oob_hook, :watched, keyword_init: true) do
      def oob_total = oob_minor + oob_major
      def inside_total = inside_minor + inside_major

      # Share of all GC runs since the first request that happened outside requests.
      def outside_ratio
        total = oob_total + inside_total
        total.zero? ? 1.0 : oob_total.fdiv(total)
      end
    end

    # Ruby's GC_HEAP_FREE_SLOTS_MIN_RATIO: the free share of the heap a GC
    # must leave, or the next one is major.
    MIN_FREE_RATIO = Float(ENV.fetch("RUBY_GC_HEAP_FREE_SLOTS_MIN_RATIO", "0.20")) rescue 0.20

    @lock = Mutex.new
    @stats = Stats.new(requests: 0, oob_minor: 0, oob_major: 0, inside_minor: 0, inside_major: 0, oob_seconds: 0.0,
                       oob_hook: 0, watched: 0)
    @in_flight = 0
    @mark = nil
    @hook_pid = nil # the process where Puma's out_of_band hook has run
    @pending = nil  # the middleware that has a GC due, for that hook

    class << self
      # A frozen copy of this process's counters (see Stats).
      def stats
        @lock.synchronize { @stats.dup.freeze }
      end

      # Zeroes the counters, for a benchmark that wants to measure one phase.
      def reset_stats
        @lock.synchronize { @stats.members.each { |m| @stats[m] = m == :oob_seconds ? 0.0 : 0 } }
      end

      # A request starts. The GC counts are taken when the process goes from
      # idle to busy, and again when it goes back: what happens in between ran
      # inside requests.
      def enter # :nodoc:
        @lock.synchronize do
          @mark = [GC.stat(:minor_gc_count), GC.stat(:major_gc_count)] if @in_flight.zero?
          @in_flight += 1
        end
      end

      # A request has been answered. Yields (under the lock, so no request can
      # be counted as starting meanwhile) when the process has become idle.
      def leave # :nodoc:
        @lock.synchronize do
          @in_flight -= 1
          @stats.requests += 1
          next unless @in_flight.zero?

          if @mark
            @stats.inside_minor += GC.stat(:minor_gc_count) - @mark[0]
            @stats.inside_major += GC.stat(:major_gc_count) - @mark[1]
          end
          yield if block_given?
        end
      end

      # Yields under the lock if this request is the only one in flight.
      def alone? # :nodoc:
        @lock.synchronize { @in_flight == 1 && yield }
      end

      # Puma's out_of_band hook: runs the GC a middleware found due, now that
      # the worker is idle and not accepting.
      def out_of_band
        @lock.synchronize do
          @hook_pid = Process.pid
          pending = @pending
          @pending = nil
          @stats.oob_hook += pending.send(:out_of_band) if pending && @in_flight.zero?
        end
      end

      # Under the lock (in #leave's block): leave the GC to the server's hook
      # if it has one in this process, else run it now.
      def defer(middleware) # :nodoc:
        return false unless @hook_pid == Process.pid

        @pending = middleware
        true
      end

      def watched(runs) # :nodoc:
        @stats.watched += runs
      end

      def record(major, seconds) # :nodoc:
        major ? @stats.oob_major += 1 : @stats.oob_minor += 1
        @stats.oob_seconds += seconds
      end
    end

    # headroom: how many requests' worth of allocation must remain before the
    #   next GC for this middleware to leave the heap alone (1.5 = the next
    #   request and half as much again; higher collects earlier and more
    #   often, lower risks a GC inside the request). The per-request figure is
    #   already the largest recent request, decaying slowly.
    # decay: how fast the remembered per-request allocation forgets a large
    #   request (each request keeps this share of the previous estimate).
    # enabled: false turns the middleware into a pass-through, e.g. per env.
    def initialize(app, headroom: 1.5, decay: 0.95, enabled: true)
      raise InvalidArgument, "Memkit::OobGC: headroom must be a number >= 1 (got #{headroom.inspect})" unless headroom.is_a?(Numeric) && headroom >= 1
      raise InvalidArgument, "Memkit::OobGC: decay must be between 0 and 1 (got #{decay.inspect})" unless decay.is_a?(Numeric) && decay >= 0 && decay < 1

      @app = app
      @headroom = headroom.to_f
      @hook_headroom = 1 + ((@headroom - 1) / 2) # see #finished
      @decay = decay.to_f
      @enabled = enabled
      @per_heap = GC.respond_to?(:stat_heap) && GC.stat_heap(0).key?(:total_allocated_objects)
      # Sweeping lazily leaves the free-slot count short until the sweep ends.
      # With one heap (3.1) the slots marked live say what the sweep will
      # free; size pools (3.2+) have no marked count per pool, so there the
      # out-of-band GC sweeps at once.
      @lazy_sweep = !@per_heap && GC.stat.key?(:heap_marked_slots)
      @stat = {}
      @gc_seen = nil # [GC count, total_allocated_objects, major_gc_count] when last looked
      @marked_at = 0 # total_allocated_objects when the latest mark ended (or before)
      @survived = nil # young objects the latest out-of-band minor GC kept (one heap only)
      @major_at = nil # GC count at the latest major seen (one heap only)
      @rate = nil # per-request growth estimates, set after the first request
      # Size pools (3.2+) grow one by one, and a full GC there can add
      # allocatable pages with nothing new live (Ruby 3.3, bench/RESULTS.md,
      # session 7): the heap's size says nothing about it having settled, so
      # there the middleware collects from the start.
      @settled = @per_heap # see #settled?
      @sized = nil # [GC count, heap pages] when last looked, until then
    end

    def call(env)
      return @app.call(env) unless @enabled

      self.class.enter
      before = snapshot({})
      begin
        status, headers, body = @app.call(env)
      rescue Exception # rubocop:disable Lint/RescueException -- the request is over whatever ended it
        self.class.leave
        raise
      end
      if collecting_next?(before)
        # A major GC will make this worker pause once the response is out
        # (100 ms and more on a large heap). A kept-alive client would send
        # its next request here and wait it out; told to close, it
        # reconnects, and a worker that is not collecting accepts it. Puma
        # passes the header on (and clients honour it); Unicorn closes every
        # connection anyway. Not for minors: moving a connection leaves the
        # workers unbalanced until the next move, which cost saturated
        # throughput more than the short pause did (bench/RESULTS.md).
        headers = headers.frozen? ? headers.dup : headers
        headers["connection"] = "close"
      end
      body = AfterReply.register(env, body) { finished(before) }
      [status, headers, body]
    end

    private

    # What a request changes: objects allocated (per size pool on 3.2+) and
    # malloc'd bytes. Oldmalloc grows with malloc, so one rate serves both.
    def snapshot(stat)
      GC.stat(stat)
      [stat[:count], allocated(stat), stat[:malloc_increase_bytes]]
    end

    def allocated(stat)
      return [stat[:total_allocated_objects]] unless @per_heap

      heaps.map { |i| GC.stat_heap(i, :total_allocated_objects) }
    end

    def heaps
      @heaps ||= (0...GC::INTERNAL_CONSTANTS.fetch(:SIZE_POOL_COUNT) { GC.stat_heap.size }).to_a
    end

    def finished(before)
      self.class.leave do
        learn(before)
        next unless settled?

        due = due?
        # Left to the hook only while the next request still fits, with half
        # the headroom to spare: the hook does not run if that request is
        # already queued, and then the GC would start inside it. The spare is
        # for what the estimate cannot see (the server's own allocations
        # between requests, pages the sweep gives back, slots held by
        # finalizers): with none, on Puma with one new connection per
        # request, 7-15 of 111-128 GCs ran inside requests.
        run(due) if due && (due?(@hook_headroom) || !self.class.defer(self))
      end
    end

    # Whether, as the heap stands with this response built, a major GC will
    # be due once it has been sent (only the last request in flight runs one).
    def collecting_next?(before)
      self.class.alone? do
        next false unless @rate && @settled

        snapshot(@stat)
        seen_gc(before[1][0])
        due? == :major
      end
    end

    # Called by OobGC.out_of_band, under its lock, with no request in flight:
    # the heap as it is now decides. Returns the number of GCs run.
    def out_of_band
      GC.stat(@stat)
      seen_gc
      return 0 unless settled?

      due = due?
      due ? run(due) : 0
    end

    # Ruby sizes the heap at the GCs it starts itself, from the objects live
    # then. While a new worker's live set is still growing (caches, the first
    # requests' memoized data), a GC run early, out of band, sees fewer of
    # them, Ruby grows the heap less, and the smaller heap reaches its major
    # GC threshold sooner for as long as the process lives: on Puma with the
    # promotion-heavy bench app, 8.0 majors per 1,000 requests against Ruby's
    # 6.0 (bench/RESULTS.md, session 7). So the middleware only watches until
    # a GC of Ruby's own has left the heap no larger (the pages in use plus
    # those it may add). A live set that keeps growing does not keep it
    # watching: the minor GC that leaves the heap short, and makes the next
    # GC major instead of growing it, leaves it no larger. One heap only (see
    # #initialize).
    def settled?
      return true if @settled

      # Not heap_allocated_pages: it still counts the pages a sweep has just
      # emptied, and Ruby lists those as allocatable too.
      pages = @stat.fetch(:heap_eden_pages, 0) + @stat.fetch(:heap_allocatable_pages, 0)
      if @sized && @stat[:count] != @sized[0]
        self.class.watched(@stat[:count] - @sized[0])
        @settled = pages <= @sized[1]
      end
      @sized = [@stat[:count], pages]
      @settled
    end

    # A request during which a GC ran says nothing about malloc growth (the
    # counter was reset), but its object allocation is still right.
    def learn(before)
      count, objects, malloc = snapshot(@stat)
      seen_gc(before[1][0])
      fresh = objects.zip(before[1]).map { |now, was| now - was }
      grown = count == before[0] ? [malloc - before[2], 0].max : nil
      if @rate
        @rate[0] = @rate[0].zip(fresh).map { |old, new| [new, old * @decay].max }
        @rate[1] = [grown, @rate[1] * @decay].max if grown
      else
        @rate = [fresh, grown || 0]
      end
    end

    # :major, :minor or nil: the GC the next request (with headroom) would start.
    def due?(headroom = @headroom)
      objects, malloc = @rate
      minor = (slots_short?(objects, headroom) && !starved?) ||
              @stat[:malloc_increase_bytes] + malloc * headroom > @stat[:malloc_increase_bytes_limit]
      return unless minor

      major_pending? || minor_would_fill? ? :major : :minor
    end

    # Ruby decides at the end of a GC that the next one will be major (too
    # many old objects, or unprotected ones); 3.3 tells us, older Rubies need
    # the same test done here. Whichever GC the next request triggers will then
    # be major, so the out-of-band one must be too.
    def major_pending?
      info = GC.latest_gc_info
      return true if info[:need_major_by]
      return true if @stat[:old_objects] >= @stat[:old_objects_limit]

      limit = @stat[:remembered_wb_unprotected_objects_limit].to_i
      return true if limit.positive? && @stat[:remembered_wb_unprotected_objects] >= limit

      # Ruby compares oldmalloc with its limit when a GC starts, and only then
      # picks a major one for it (it never starts a GC for oldmalloc alone).
      # Running the major before the limit is crossed would hide the overrun
      # from Ruby, which then shrinks the limit instead of growing it, and
      # majors come ever more often.
      @stat[:oldmalloc_increase_bytes] > @stat[:oldmalloc_increase_bytes_limit]
    end

    def slots_short?(objects, headroom = @headroom)
      if @per_heap
        heaps.each_with_index.any? { |i, k| heap_free(i) < objects[k] * headroom }
      else
        free_slots < objects[0] * headroom
      end
    end

    # Free slots in the heap, plus the pages Ruby may still add without
    # collecting first. While a lazy sweep is under way heap_free_slots counts
    # only the pages swept so far, and Ruby starts no GC before the sweep has
    # reached the last page; what will be free then is what the mark left
    # unmarked, less what has been allocated since.
    def free_slots
      free = if sweeping?
               eden_slots - @stat[:heap_marked_slots] - (@stat[:total_allocated_objects] - @marked_at)
             else
               @stat[:heap_free_slots]
             end
      free + allocatable_slots
    end

    # Slots in the pages objects can be allocated in (not the empty pages
    # the sweep has set aside to give back).
    def eden_slots
      @stat[:heap_eden_pages] * page_slots
    end

    # The pages Ruby may still add to the heap without collecting first.
    def allocatable_slots
      @stat.fetch(:heap_allocatable_pages, 0) * page_slots
    end

    def sweeping?
      @lazy_sweep && GC.latest_gc_info(:state) == :sweeping
    end

    # A GC has run since the last look if the count moved; its mark ended
    # after the allocations counted then (the figure errs towards less free),
    # and if it was a major, at about the count seen now.
    def seen_gc(allocated_before = nil)
      return unless @lazy_sweep

      count = @stat[:count]
      if @gc_seen && count != @gc_seen[0]
        @marked_at = allocated_before && allocated_before > @gc_seen[1] ? allocated_before : @gc_seen[1]
        @major_at = count if @stat[:major_gc_count] != @gc_seen[2]
      end
      @gc_seen = [count, @stat[:total_allocated_objects], @stat[:major_gc_count]]
    end

    # Free slots in one size pool, plus the pages Ruby may still add to it
    # without collecting first.
    def heap_free(index)
      h = GC.stat_heap(index)
      live = h[:total_allocated_objects] - h[:total_freed_objects]
      per_page = h[:heap_eden_pages].zero? ? 0 : h[:heap_eden_slots] / h[:heap_eden_pages]
      h[:heap_eden_slots] - live + h.fetch(:heap_allocatable_pages, 0) * per_page
    end

    # A heap so small that even right after a GC it cannot hold one request
    # (Ruby keeps only 20% of it free) gains nothing from collecting early:
    # the request will collect anyway. Wait until Ruby has grown the heap.
    def starved?
      @starved_at && @stat[:heap_available_slots] <= @starved_at
    end

    def page_slots
      GC::INTERNAL_CONSTANTS.fetch(:HEAP_PAGE_OBJ_LIMIT, 409)
    end

    # Returns how many GCs it ran (1 or 2).
    def run(kind)
      runs = 1
      collect(kind)
      # A minor GC that leaves less than the minimum free share of the heap
      # makes Ruby's next GC a major one ("nofree"), which is also how Ruby
      # grows a tight heap. Better now, between requests, than in the next
      # one. Ruby 3.3 says so (need_major_by, its rule works per size pool);
      # for older Rubies the same rule is applied to the heap as a whole.
      if kind == :minor && major_next?
        collect(:major)
        runs += 1
      end
      @starved_at = slots_short?(@rate[0], 1.0) ? @stat[:heap_available_slots] : nil
      runs
    end

    def major_next?
      info = GC.latest_gc_info
      return info[:need_major_by] if info.key?(:need_major_by)

      # Ruby's own test at the end of the mark (gc_marks_finish): the slots
      # the sweep will leave free, all but the marked ones, against the heap
      # including the pages it may still add.
      !grows_instead?(@stat[:count]) && fills?(@stat[:heap_marked_slots])
    end

    # Whether a heap where this many slots are marked is short of free ones.
    def fills?(marked)
      total = eden_slots + allocatable_slots
      total - marked < total * MIN_FREE_RATIO
    end

    # Within RVALUE_OLD_AGE (3) GCs of the last major, a minor GC that leaves
    # the heap short grows it instead of asking for a major (gc_marks_finish).
    def grows_instead?(count)
      @major_at && count - @major_at < 3
    end

    # On one heap (3.1) a minor GC keeps every old object and, as a rule,
    # about as many young ones as the last minor kept. If that would leave
    # less than Ruby's free minimum, the major would follow it at once (see
    # #run), and the minor is only work added to the same pause: at the
    # promotion-heavy bench app's rate, 40 ms before a 140 ms major.
    def minor_would_fill?
      return false unless @survived

      !grows_instead?(@stat[:count] + 1) && fills?(@stat[:old_objects] + @survived)
    end

    def collect(kind)
      old, majors = @stat.values_at(:old_objects, :major_gc_count)
      started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      # Only the mark must run in one piece. Sweeping lazily, as Ruby does,
      # spreads the rest over the next requests' allocations instead of making
      # whatever reaches this worker meanwhile wait for it (bench/RESULTS.md).
      GC.start(full_mark: kind == :major, immediate_sweep: !@lazy_sweep)
      self.class.record(kind == :major, Process.clock_gettime(Process::CLOCK_MONOTONIC) - started)
      GC.stat(@stat)
      @survived = @stat[:heap_marked_slots] - old if @lazy_sweep && kind == :minor
      @marked_at = @stat[:total_allocated_objects]
      @major_at = @stat[:count] if @lazy_sweep && @stat[:major_gc_count] != majors
      @gc_seen = [@stat[:count], @marked_at, @stat[:major_gc_count]]
    end
  end
end
