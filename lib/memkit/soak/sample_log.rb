# frozen_string_literal: true

module Memkit
  module Soak
    # Samples kept in columns allocated before the run, one Integer or Float
    # per cell. Recording a sample then allocates nothing that lives on:
    # Integers below 2**62 and most Floats are immediate values in Ruby, and
    # the columns never grow. A Sample object and an Array append per sample
    # are ~40 B of heap slot and ~74 B of malloc each, which on a soak
    # sampled every request read as ~114 B/request of "growth" of the app.
    class SampleLog
      COLUMNS = %i[requests seconds rss heap_live_slots heap_live_bytes malloc_bytes gc].freeze

      attr_reader :size, :capacity

      def initialize(capacity)
        @capacity = capacity
        @columns = COLUMNS.map { Array.new(capacity) }
        @size = 0
      end

      # Arguments in COLUMNS order; raises once full rather than grow.
      def record(requests, seconds, rss, heap_live_slots, heap_live_bytes, malloc_bytes, gc)
        raise Error, "sample log full (#{@capacity} samples)" if @size == @capacity

        c = @columns
        i = @size
        c[0][i] = requests
        c[1][i] = seconds
        c[2][i] = rss
        c[3][i] = heap_live_slots
        c[4][i] = heap_live_bytes
        c[5][i] = malloc_bytes
        c[6][i] = gc
        @size = i + 1
        self
      end

      def column(name) = @columns.fetch(COLUMNS.index(name) || raise(ArgumentError, "no column #{name}")).first(@size)

      def [](index)
        return nil unless index.between?(-@size, @size - 1)

        index += @size if index.negative?
        Sample.new(**COLUMNS.each_with_index.to_h { |name, c| [name, @columns[c][index]] })
      end

      def last = self[-1]

      # After the run: Sample objects, seconds rounded to the millisecond.
      def to_a = Array.new(@size) { |i| self[i].tap { |s| s.seconds = s.seconds.round(3) } }
    end
  end
end
