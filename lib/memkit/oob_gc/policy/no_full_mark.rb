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
      # at the last major (an app whose old objects are garbage faster than
      # requests end) gives full marks back to Ruby: the collector reads
      # #valve? and says so.
      class NoFullMark < SizePools
        def initialize(valve_ratio: 2.0, **options)
          super(**options)
          @valve_ratio = valve_ratio.to_f
          @baseline = nil
        end

        def decide(reading, profile, headroom: @headroom)
          return :major if major_pending?(reading)

          super
        end

        def collected(kind, reading)
          @baseline = available(reading) if kind == :major || @baseline.nil?
        end

        def observe(reading, allocated_before: nil)
          @baseline ||= available(reading)
        end

        def valve?(reading)
          !@baseline.nil? && available(reading) > @baseline * @valve_ratio
        end

        private

        def available(reading) = reading.fetch(:stat).fetch(:heap_available_slots)
      end
    end
  end
end
