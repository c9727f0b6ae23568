# frozen_string_literal: true

module Memkit
  module Soak
    # A one-line progress bar with rate and ETA, redrawn in place at most ten
    # times a second, and only on a terminal: piped or captured output gets
    # nothing, so logs and --json stay clean.
    class Progress
      WIDTH = 30

      def initialize(io, total:)
        @io = io.respond_to?(:tty?) && io.tty? ? io : nil
        @total = total
        @started = now
        @drawn = 0.0
      end

      def update(done, sample)
        return unless @io
        return if done < @total && now - @drawn < 0.1

        @drawn = now
        elapsed = now - @started
        rate = elapsed.positive? ? done / elapsed : 0
        eta = rate.positive? ? (@total - done) / rate : 0
        filled = (WIDTH * done / @total.to_f).round
        @io.print format("\r[%s%s] %3d%% %d/%d  %s req/s  ETA %s  rss %s\e[K", "#" * filled, "." * (WIDTH - filled),
                         100 * done / @total, done, @total, rate.round, clock(eta), Units.human(sample.rss))
        @io.flush
      end

      def finish
        return unless @io

        @io.print "\r\e[K"
        @io.flush
        @io = nil
      end

      private

      def clock(seconds)
        s = seconds.round
        s >= 3600 ? format("%d:%02d:%02d", s / 3600, s / 60 % 60, s % 60) : format("%d:%02d", s / 60, s % 60)
      end

      def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end
  end
end
