# frozen_string_literal: true

module Memkit
  class OobGC
    # What one request allocates in this worker, learned from the last
    # `window` requests: objects per size pool (one figure where Ruby has one
    # heap) and malloc'd bytes. The figure used is a high percentile, so one
    # huge request does not make every later GC run early (as the largest
    # recent request would) and half the requests do not overrun the
    # estimate (as the mean would).
    class Profile
      attr_reader :window, :percentile

      def initialize(window: 200, percentile: 0.95)
        unless window.is_a?(Integer) && window >= 1
          raise InvalidArgument, "Memkit::OobGC: window must be an Integer >= 1 (got #{window.inspect})"
        end
        unless percentile.is_a?(Numeric) && percentile.positive? && percentile <= 1
          raise InvalidArgument, "Memkit::OobGC: percentile must be in (0, 1] (got #{percentile.inspect})"
        end

        @window = window
        @percentile = percentile.to_f
        @objects = [] # one Array per request: objects per pool
        @malloc = []
        @cache = nil
        @stale = 0 # records since the percentiles were taken
      end

      # objects: Array of objects allocated per pool. malloc: bytes, or nil
      # when a GC ran during the request (Ruby reset the counter then).
      def record(objects, malloc)
        @objects << objects
        @objects.shift if @objects.size > @window
        if malloc
          @malloc << malloc
          @malloc.shift if @malloc.size > @window
        end
        @stale += 1
        # Sorting the window per pool after every request cost more than the
        # rest of the collector (~60 us a request on Ruby 3.4's five pools);
        # a high percentile of 200 requests moves little in 16 more.
        @cache = nil if @stale >= REFRESH || @objects.size <= REFRESH
        self
      end

      def size = @objects.size
      def empty? = @objects.empty?

      # Objects per pool one request allocates, at the percentile.
      def objects
        learned.fetch(0)
      end

      # Malloc'd bytes one request adds, at the percentile.
      def malloc
        learned.fetch(1)
      end

      def to_h = { requests: size, objects: objects, malloc: malloc }

      private

      REFRESH = 16

      def learned
        @cache ||= begin
          @stale = 0
          pools = @objects.map(&:size).max || 0
          [Array.new(pools) { |i| pick(@objects.map { |o| o.fetch(i, 0) }) }, pick(@malloc)]
        end
      end

      def pick(values)
        return 0 if values.empty?

        sorted = values.sort
        sorted[[(sorted.size * @percentile).ceil - 1, 0].max]
      end
    end
  end
end
