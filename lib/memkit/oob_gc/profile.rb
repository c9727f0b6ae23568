# frozen_string_literal: true

require_relative "../errors"

module Memkit
  class OobGC
    # What one request allocates in this worker, learned from the last
    # `window` requests: objects per size pool (one figure where Ruby has one
    # heap) and malloc'd bytes. The figure used is a high percentile, so one
    # huge request does not make every later GC run early (as the largest
    # recent request would) and half the requests do not overrun the
    # estimate (as the mean would).
    #
    # When what requests allocate shifts up (pages of another kind, longer
    # ids that move a string per row into a larger size pool), the window's
    # percentile follows only once a twentieth of the window has shifted,
    # while a small pool can run dry in a few requests: `memkit demo`'s
    # 80-byte pool went from 5 objects a request to 206 and was empty eight
    # requests later, at a learned 40. So where the third largest of the last
    # RECENT requests is more than twice the window's figure (and RECENT
    # more), it is the figure, taken as soon as a request allocates that much:
    # three heavy requests move it, one outlier does not.
    #
    # A worker's first requests allocate more than the ones after (a Rails
    # app compiles each template at its first render and loads its locale
    # files at the first translation), and in a young window the percentile
    # is one of them: on the bench Rails app (3.3, Puma) the heap grown for
    # the first request's 27k objects in the 80-byte pool took the whole RSS
    # budget, and the 160-byte pool that ran dry later stayed short. So the
    # first FIRST requests count until SETTLED have been recorded, and then
    # leave the window; the collector sizes the heap only from a settled
    # profile (#settled?).
    #
    # #version changes only when the learned figures do, so the collector
    # can keep a decision taken from them until then.
    class Profile
      # Taking the percentile of 200 requests costs 2-6 us per pool (Ruby's
      # sort and max(n) alike), more than the rest of the collector's work
      # for a request if done after each one. A high percentile of the window
      # moves little in a quarter of it: the figures are taken again after
      # every request while the first REFRESH are learned, then every
      # REFRESH, or a quarter of the window once that is more.
      REFRESH = 16
      # Requests the recent figure looks back on (see above).
      RECENT = 16
      # Of those, the rank taken: with a twentieth of requests above the
      # window's percentile, three of sixteen come above it by chance once
      # in 23 looks (two would, once in 5, and collect early for nothing).
      RANK = 3
      # The requests forgotten, once SETTLED are recorded (see above).
      FIRST = 16
      SETTLED = 2 * FIRST

      attr_reader :window, :percentile, :version

      def initialize(window: 200, percentile: 0.95)
        unless window.is_a?(Integer) && window >= 1
          raise InvalidArgument, "Memkit::OobGC: window must be an Integer >= 1 (got #{window.inspect})"
        end
        unless percentile.is_a?(Numeric) && percentile.positive? && percentile <= 1
          raise InvalidArgument, "Memkit::OobGC: percentile must be in (0, 1] (got #{percentile.inspect})"
        end

        @window = window
        @percentile = percentile.to_f
        @columns = [] # per pool: objects allocated, one entry per request, a ring of `window`
        @size = 0
        @at = 0 # where the next request goes in the ring
        @malloc = []
        @learned = [[].freeze, 0, [].freeze].freeze
        @tops = [] # per pool, the most objects a request in the window allocated, at the last relearn or since
        @limits = [].freeze # per pool, objects past which a request is part of a shift (#shifted)
        @malloc_limit = RECENT
        @picked = [[], 0] # the window's percentiles at the last relearn
        @version = 0
        @stale = 0 # records since the percentiles were taken
        @recorded = 0 # requests recorded in all, up to SETTLED
        @malloc_late = 0 # malloc entries of the requests after the FIRST
      end

      # objects: Array of objects allocated per pool. malloc: bytes, or nil
      # when a GC ran during the request (Ruby reset the counter then).
      def record(objects, malloc) = record_since(objects, nil, malloc)

      # As #record, with objects per pool given as counts now and `before`
      # the request (the collector's readings, without an Array for the
      # difference).
      def record_since(now, before, malloc)
        at = @at
        @size += 1 if @size < @window
        @at = at + 1 == @window ? 0 : at + 1
        limits = @limits
        moved = false
        i = 0
        while i < now.size
          objects = before ? now[i] - before[i] : now[i]
          (@columns[i] ||= Array.new(@size, 0))[at] = objects
          # Past a shift's limit, or the largest request the window holds (#beyond).
          moved = true if objects > limits.fetch(i, RECENT) || objects > @tops.fetch(i, 0)
          i += 1
        end
        (now.size...@columns.size).each { |j| @columns[j][at] = 0 } if now.size < @columns.size
        if malloc
          @malloc << malloc
          @malloc.shift if @malloc.size > @window
          moved = true if malloc > @malloc_limit
        end
        @stale += 1
        if @recorded < SETTLED
          @malloc_late += 1 if malloc && @recorded >= FIRST
          @recorded += 1
          return forget_first if @recorded == SETTLED
        end
        if @size <= REFRESH || (@stale >= REFRESH && @stale >= @size / 4)
          relearn
        elsif moved
          learn
        end
        self
      end

      def size = @size
      def empty? = @size.zero?

      # Whether the first requests have left the figures (see above).
      def settled? = @recorded >= SETTLED

      # Objects per pool one request allocates, at the percentile.
      def objects = @learned.fetch(0)

      # Malloc'd bytes one request adds, at the percentile.
      def malloc = @learned.fetch(1)

      # Objects per pool the window's largest request allocated beyond
      # #objects: how far past the figure a request has been seen to go.
      def beyond = @learned.fetch(2)

      # [#objects, #malloc, #beyond], frozen: what the collector keeps of the
      # figures it took its margins with (Policy#remargin), with no Array of
      # its own.
      def learned = @learned

      def to_h = { requests: size, objects: objects, malloc: malloc }

      private

      # Keeps, of the window, the requests after the FIRST, in the order
      # they came (where the window is smaller than SETTLED, those it still
      # holds), and takes the figures again.
      def forget_first
        keep = [@size, SETTLED - FIRST].min
        @columns.map! { |c| Array.new(keep) { |k| c[(@at - keep + k) % @size] } }
        @size = keep
        @at = keep % @window
        @malloc = @malloc.last(@malloc_late)
        relearn
        self
      end

      # The window's percentiles, on the schedule above.
      def relearn
        @stale = 0
        @picked = [@columns.map { |c| pick(c) }, pick(@malloc)]
        @tops = @columns.map(&:max)
        learn
      end

      # The figures: the percentiles, or the recent requests' where those
      # are more than twice as high, and RECENT more (a few objects more in a
      # pool a request barely uses, such as the collector's own readings
      # near a GC, are no shift). Between two relearns only the recent
      # figures are taken again.
      def learn
        picked = @picked
        objects = @columns.each_with_index.map { |c, i| shifted(picked[0].fetch(i, 0), recent(c)) }.freeze
        tops = @tops = @columns.each_with_index.map { |c, i| [@tops.fetch(i, 0), c[@at - 1]].max }
        learned = [objects, shifted(picked[1], ranked(@malloc.last(RECENT))),
                   objects.each_with_index.map { |n, i| [tops[i] - n, 0].max }.freeze].freeze
        return if learned == @learned

        @learned = learned
        # A request past these is part of a shift (#shift?): checked as each
        # is recorded, so taking the figures again (which allocates) stays
        # off most requests.
        @limits = learned[0].map { |objects| limit(objects) }.freeze
        @malloc_limit = limit(learned[1])
        @version += 1
      end

      def shifted(percentile, recent) = shift?(percentile, recent) ? recent : percentile
      def shift?(percentile, value) = value > limit(percentile)
      def limit(percentile) = (2 * percentile) + RECENT

      # The RANK-th largest of the last RECENT entries of a ring column.
      def recent(column)
        n = [RECENT, @size].min
        from = @at - n
        ranked(from.negative? ? column.last(-from) + column.first(@at) : column[from, n])
      end

      def ranked(values)
        return 0 if values.empty?

        values.max(RANK).last
      end

      # The value at the percentile's rank (the n-th largest), or more where
      # the requests above it allocate more than their share. GC runs come
      # with what is allocated, not with how many requests allocate it: one
      # request in 20 of 240k objects among requests of 2k-18k allocates
      # two thirds of the objects, at the percentile's edge, and its
      # figure (18k, or 240k once its twentieth was in the window) moved
      # with each window: 16-26% of GC runs inside requests on Unicorn, and
      # 1.7x Ruby alone's GC runs on Puma (bench/oobgc_matrix.rb's "mixed",
      # docs/BENCHMARKS.md). So the figure is at least the one beyond which
      # the window's requests allocate no more than the percentile leaves
      # out (5% of all), where that is a shift (#shift?): a tail under twice
      # the percentile is the headroom's to cover, and a pool that requests
      # barely use (12 objects in a few, none in most: 3.4's "tiny") would
      # change the figures at every look. Requests past the RANK-th largest
      # count as that one, so that one outlier still moves the figure by
      # one step only.
      def pick(values)
        return 0 if values.empty?

        rank = values.size - [(values.size * @percentile).ceil - 1, 0].max
        tops = values.max(rank)
        figure = tops.last
        return figure if rank <= RANK

        cap = tops[RANK - 1]
        allowed = (1 - @percentile) * (values.sum - tops.first(RANK - 1).sum + ((RANK - 1) * cap))
        above = 0
        tops.each_with_index do |value, k|
          value = cap if value > cap
          if above - (k * value) > allowed
            # The k largest allocate `allowed` beyond a figure between this
            # value and the one before.
            tail = ((above - allowed) / k).ceil
            return shift?(figure, tail) ? tail : figure
          end
          above += value
        end
        figure
      end
    end
  end
end
