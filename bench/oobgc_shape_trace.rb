# frozen_string_literal: true

# One bench/oobgc_shapes.rb cell (mode memkit, or none) with each out-of-band GC
# printed: the request it followed, what started it, each pool's free slots
# as the policy counts them, each pool's slots after it, and, on Ruby 3.4,
# the growth planned and the pools' shares of the last dry GC's pages; and
# each pool's slots at the end. Mode none (Ruby alone) prints only those.
#   script/ruby34 bundle exec ruby -Ilib bench/oobgc_shape_trace.rb medium [requests] [memkit|none]
require "memkit"
require "memkit/oob_gc"

shape = ARGV.fetch(0, "medium")
env = File.read(File.expand_path("oobgc_shapes.rb", __dir__))[/^  "#{Regexp.escape(shape)}" => (\{[^}]*\})/, 1] or
  abort "oobgc_shape_trace: no shape #{shape.inspect} in bench/oobgc_shapes.rb"
env.scan(/"(\w+)" => "([^"]*)"/) { |k, v| ENV[k] = v }

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
at_exit { warn "slots at the end #{Memkit::OobGC::Collector.eden_slots}" }
ARGV.replace(["--child", ARGV.fetch(2, "memkit"), ARGV.fetch(1, "600")])
load File.expand_path("oobgc_shapes.rb", __dir__)
