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

        # A major for want of free slots (:nofree) is left undone: with full
        # marks off Ruby grows the heap instead, the sizing this wants. Old
        # objects, unprotected ones and oldmalloc still need the major.
        def major_pending?(reading)
          return false if reading.fetch(:info)[:need_major_by] == :nofree && !super(without_nofree(reading))

          super
        end

        def major_next?(reading)
          !%i[nofree].include?(reading.fetch(:info)[:need_major_by]) && super
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

        def without_nofree(reading)
          reading.merge(info: reading.fetch(:info).merge(need_major_by: nil))
        end

        def available(reading) = reading.fetch(:stat).fetch(:heap_available_slots)
      end
    end
  end
end
