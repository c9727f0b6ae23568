# frozen_string_literal: true

module Memkit
  # Ruby's gc_rest: GC.disable first finishes a GC under way (incremental
  # marking, lazy sweeping). What a heap holds free, and what malloc'd memory
  # a GC's garbage held, is known only once its sweep is done.
  module GCRest
    # Finishes the GC under way, if any; GC stays off if it was off.
    def self.finish
      GC.enable unless GC.disable
      nil
    end
  end
end
