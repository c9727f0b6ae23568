# frozen_string_literal: true

# For the probes bench/oobgc_rails.rb --patch loads: XWANT=N sizes the heap
# for N in place of Collector::COVER (each pool holds N + 1 reserves).
module WantOverride
  def initialize(**options)
    super
    want = ENV.fetch("XWANT", "")
    @want = Integer(want) unless want.empty?
  end
end
Memkit::OobGC::Collector.prepend(WantOverride)
