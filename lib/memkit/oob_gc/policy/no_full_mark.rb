# frozen_string_literal: true

module Memkit
  class OobGC
    class Policy
      # Ruby 3.4+ with GC.config(rgengc_allow_full_mark: false) while serving:
      # Ruby never starts a major GC itself; where it would, it grows the heap
      # and sets latest_gc_info(:need_major_by). So every major is ours, run
      # between requests as soon as one is due, slots short or not.
      #
      # Safety valve: a heap that has grown past `valve_ratio` times its size
      # at the last major while Ruby asks for a major (an app whose old
      # objects are garbage faster than requests end, with no idle moment to
      # run one) gives full marks back to Ruby: the collector reads #valve?
      # and says so. Growth with no major asked for is Ruby's own sizing (a
      # worker's heap grows during its first requests): not the valve's case.
      class NoFullMark < SizePools
        def initialize(valve_ratio: 2.0, **options)
          super(**options)
          @valve_ratio = valve_ratio.to_f
          @baseline = nil
        end

        # Ruby looks at oldmalloc only at the end of a minor GC; with full
        # marks off, a worker whose heap holds many requests may run none
        # for thousands, while oldmalloc (malloc by objects that have aged)
        # goes far past its limit. So oldmalloc past the limit makes a minor
        # due at once: Ruby raises the limit and asks for the major, which
        # the collector then runs (see Policy#major_pending?).
        def decide(reading, profile, headroom: @headroom)
          return :major if major_pending?(reading)
          return :minor if !profile.empty? && oldmalloc_over?(reading)

          super
        end

        def margins(reading, profile, headroom: @headroom)
          margins = super or return
          stat = reading.fetch(:stat)
          oldmalloc = stat.fetch(:oldmalloc_increase_bytes_limit) - stat.fetch(:oldmalloc_increase_bytes)
          margins.malloc = [margins.malloc, oldmalloc].compact.min
          margins
        end

        # Swept at once: Ruby asks for a major (NOFREE) at the end of a sweep,
        # and with full marks off it grows the heap instead if that comes
        # mid-request.
        def sweep_lazily?(_reading, _profile) = false

        def collected(kind, reading)
          @baseline = available(reading) if kind == :major || @baseline.nil?
        end

        def observe(reading, allocated_before: nil)
          @baseline ||= available(reading)
        end

        def valve?(reading)
          !@baseline.nil? && !reading.fetch(:info)[:need_major_by].nil? &&
            available(reading) > @baseline * @valve_ratio
        end

        private

        def available(reading) = reading.fetch(:stat).fetch(:heap_available_slots)
      end
    end
  end
end
