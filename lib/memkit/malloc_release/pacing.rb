# frozen_string_literal: true

module Memkit
  module MallocRelease
    # Whether the major GC that just ran should trim, from the process's RSS
    # around the earlier trims.
    #
    # A trim pays off when what it gives back stays given back. An app that
    # mallocs as much again before its next major only takes the pages back
    # through page faults: on the "malloc" shape (8 MB malloc'd a request,
    # a major every ~80 requests on Ruby 3.1) each trim gave back 40-130 MB
    # that the next requests faulted in again, and a Puma worker spent
    # 6.6-8.0 ms of CPU a request with a trim at every major, 2.2-3.1 ms
    # paced (docs/BENCHMARKS.md, "malloc release on a malloc-heavy app"). So when
    # the RSS has grown back by half of what the last trim gave back, the
    # next trims wait for twice as many majors as before (at most
    # MAX_WAIT); a trim whose memory stayed given back puts the wait back
    # to none. A trim that gave back less than SMALL costs a few
    # milliseconds of faults at most, and never starts a wait.
    class Pacing
      MAX_WAIT = 64
      SMALL = 8 << 20

      attr_reader :wait

      def initialize
        @wait = 0 # majors to let pass before the next trim
        @left = 0 # of those, still to pass
        @floor = nil # RSS right after the last trim
        @given_back = 0 # bytes the last trim gave back
      end

      # At a major GC that calls for a trim.
      def trim?
        return true unless @left.positive?

        @left -= 1
        false
      end

      # After a trim: the RSS just before and just after it (nil where it
      # cannot be read, which leaves every major trimming).
      def trimmed(before, after)
        return unless before && after

        grew_back = @floor && @given_back >= SMALL && before - @floor >= @given_back / 2
        @wait = grew_back ? [[@wait * 2, 1].max, MAX_WAIT].min : 0
        @left = @wait
        @floor = after
        @given_back = [before - after, 0].max
      end
    end
  end
end
