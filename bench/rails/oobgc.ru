# frozen_string_literal: true

# rackup file for bench/oobgc_rails.rb: the bench Rails app, preloaded in the
# master, with a GC probe outermost and, when OOBGC=1, `use Memkit::OobGC`
# (default options) between the probe and Rails.
#
# The probe counts, per worker, from its OOBGC_SKIP+1st request: requests,
# GC runs in all, GC runs (and majors) that started and ended inside a
# request. Each worker writes them, with its RSS and Memkit::OobGC.stats, to
# OOBGC_DIR/gc-PID.json when it exits. Single-threaded workers only.
require "json"
require_relative "app"
Rails.application.initialize!

module BenchRails
  class GcProbe
    SKIP = Integer(ENV.fetch("OOBGC_SKIP", "100"))

    def initialize(app, dir)
      @app = app
      @dir = dir
      @seen = 0
      zero
      at_exit { write }
    end

    def call(env)
      @seen += 1
      zero if @seen == SKIP + 1
      count = GC.count
      major = GC.stat(:major_gc_count)
      response = @app.call(env)
      @inside += GC.count - count
      @inside_major += GC.stat(:major_gc_count) - major
      @requests += 1
      response
    end

    private

    def zero
      @gc = GC.count
      @major = GC.stat(:major_gc_count)
      @inside = 0
      @inside_major = 0
      @requests = 0
    end

    def write
      return if @dir.nil? || @seen <= SKIP

      oob = (Memkit::OobGC.stats.to_h if defined?(Memkit::OobGC::Counters))
      File.write(File.join(@dir, "gc-#{Process.pid}.json"), JSON.generate(
        requests: @requests, gc_total: GC.count - @gc, gc_major: GC.stat(:major_gc_count) - @major,
        gc_inside: @inside, gc_inside_major: @inside_major, heap_slots: GC.stat(:heap_available_slots),
        rss_kb: File.read("/proc/self/status")[/VmRSS:\s+(\d+)/, 1].to_i, oob: oob
      ))
    end
  end
end

use BenchRails::GcProbe, ENV.fetch("OOBGC_DIR", nil)
use Memkit::OobGC if ENV["OOBGC"] == "1"
run Rails.application
