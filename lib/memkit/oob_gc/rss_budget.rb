# frozen_string_literal: true

module Memkit
  class OobGC
    # How many more bytes of object pages the heap may gain, from the
    # worker's measured RSS rather than from the pages alone.
    #
    # Growing the heap costs more RSS than its pages: with more requests
    # between GCs, more of their garbage holds memory until the GC (its
    # malloc'd blocks, Ruby 3.1's transient heap). On the bench Rails app on
    # Ruby 3.1 the pages were a third of the RSS growth added
    # (docs/BENCHMARKS.md, "OobGC on the Rails app"). So the bound is on RSS at the top of a
    # GC cycle (read just before an out-of-band GC, when the garbage is
    # largest): it may rise to (1 + share) times its level before any growth,
    # and each page byte still to grow is charged the RSS each page byte grown
    # so far has cost (at least 1).
    #
    # Pure: RSS readings in, bytes out.
    class RssBudget
      attr_reader :base

      def initialize(share:)
        @share = share.to_f
        @base = nil
      end

      # top: RSS bytes just before this GC; grown: page bytes the heap has
      # gained so far. Until the heap has grown, the level follows the
      # highest top seen: a young worker's RSS still rises as it warms up,
      # with or without OobGC.
      def bytes(top, grown)
        @base = top if @base.nil? || (grown.zero? && top > @base)
        cost = grown.positive? ? [(top - @base).fdiv(grown), 1.0].max : 1.0
        room = (@base * (1 + @share)) - top
        room.positive? ? (room / cost).floor : 0
      end
    end
  end
end
