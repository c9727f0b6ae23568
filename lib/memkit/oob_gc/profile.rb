# frozen_string_literal: true

module Memkit
  class OobGC
    # What one request allocates in this worker, learned from the last
    # `window` requests: objects per size pool (one figure where Ruby has one
    # heap) and malloc'd bytes. The figure used is a high percentile, so one
    # huge request does not make every later GC run early (as the largest
    # recent request would) and half the requests do not overrun the
    # estimate (as the mean would).
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
        @learned = [[].freeze, 0].freeze
        @version = 0
        @stale = 0 # records since the percentiles were taken
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
        i = 0
        while i < now.size
          (@columns[i] ||= Array.new(@size, 0))[at] = before ? now[i] - before[i] : now[i]
          i += 1
        end
        (now.size...@columns.size).each { |j| @columns[j][at] = 0 } if now.size < @columns.size
        if malloc
          @malloc << malloc
          @malloc.shift if @malloc.size > @window
        end
        @stale += 1
        relearn if @size <= REFRESH || @stale >= REFRESH && @stale >= @size / 4
        self
      end

      def size = @size
      def empty? = @size.zero?

      # Objects per pool one request allocates, at the percentile.
      def objects = @learned.fetch(0)

      # Malloc'd bytes one request adds, at the percentile.
      def malloc = @learned.fetch(1)

      def to_h = { requests: size, objects: objects, malloc: malloc }

      private

      def relearn
        @stale = 0
        learned = [@columns.map { |c| pick(c) }.freeze, pick(@malloc)].freeze
        return if learned == @learned

        @learned = learned
        @version += 1
      end

      # The value at the percentile's rank: the n-th largest.
      def pick(values)
        return 0 if values.empty?

        values.max(values.size - [(values.size * @percentile).ceil - 1, 0].max).last
      end
    end
  end
end
