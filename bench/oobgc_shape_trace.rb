# frozen_string_literal: true

# One bench/oobgc_shapes.rb cell (mode memkit, or none) with each out-of-band GC
# printed: the request it followed, what started it, each pool's free slots
# as the policy counts them, each pool's slots after it, and, on Ruby 3.4,
# the growth planned and the pools' shares of the last dry GC's pages; and
# each pool's slots at the end. Mode none (Ruby alone) prints only those.
#   script/ruby34 bundle exec ruby -Ilib bench/oobgc_shape_trace.rb medium [requests] [memkit|none]
require "memkit"
require "memkit/oob_gc"
require_relative "oobgc_shapes"

shape, requests, mode = ARGV
shape ||= "medium"
SHAPES.fetch(shape) { abort "oobgc_shape_trace: no shape #{shape.inspect} (#{SHAPES.keys.join(', ')})" }
      .each { |k, v| ENV[k] = v }

module ShapeTrace
  def collect(kind, reading, lazy, headroom)
    free = @policy.free(reading).map(&:round)
    share = @policy.instance_variable_get(:@share)
    result = super
    warn format("request %4d %-5s by %-7s free %p slots %p plan %p shares %p", @seen, kind,
                GC.latest_gc_info[:gc_by], free, Memkit::OobGC::Collector.eden_slots,
                @dry&.instance_variable_get(:@plan), share && share[1])
    result
  end
end
Memkit::OobGC::Collector.prepend(ShapeTrace)
child(mode || "memkit", Integer(requests || REQUESTS.fetch(shape)))
warn "slots at the end #{Memkit::OobGC::Collector.eden_slots}"
