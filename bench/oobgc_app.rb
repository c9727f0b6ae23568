# frozen_string_literal: true

# The GC-heavy app for bench/oobgc.rb: a heap like a booted app's (long-lived
# strings, hashes and arrays of several sizes), and requests that allocate
# tens of thousands of short-lived objects each, as a page render does.
require "json"

module OobgcBench
  ROWS = Integer(ENV.fetch("OOBGC_ROWS", "1500"))

  # Long-lived objects, spread over several slot sizes.
  RETAINED = Array.new(150_000) { |i| ["k#{i}", "value #{i} " * (1 + i % 6), { id: i, name: "n#{i}" }] }.freeze

  # OOBGC_KEEP=N keeps each request's rows reachable for the next N
  # requests, as a fragment cache or memoized lookups would: they survive a
  # few minor GCs, are promoted and die old, so major GCs come every few
  # dozen requests. The default, 0, keeps nothing past its request: only
  # minor GCs (the app the recorded bench/RESULTS.md runs used).
  KEEP = Integer(ENV.fetch("OOBGC_KEEP", "0"))
  RECENT = []

  def self.render
    rows = Array.new(ROWS) do |i|
      { "id" => i, "name" => "row #{i}", "tags" => %w[a b c].map { |t| "#{t}#{i}" }, "text" => "lorem ipsum " * (i % 8) }
    end
    if KEEP.positive?
      RECENT << rows
      RECENT.shift while RECENT.size > KEEP
    end
    JSON.generate(rows).bytesize.to_s
  end

  # Counts, independently of Memkit::OobGC, how many GC runs happen while a
  # request is being served and how many in all; the workers write the figures
  # to DIR/gc-PID.json when they exit. Touching DIR/reset zeroes them (checked
  # every 0.2 s), so warm-up requests do not count. Single-threaded servers only.
  class Probe
    def initialize(app, dir)
      @app = app
      @dir = dir
      @reset_seen = nil
      @next_check = 0
      zero
      at_exit { write }
    end

    def call(env)
      check_reset
      before = GC.count
      response = @app.call(env)
      @inside += GC.count - before
      @requests += 1
      response
    end

    private

    def zero
      @base = GC.count
      @base_major = GC.stat(:major_gc_count)
      @base_time = GC.stat(:time)
      @base_cpu = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID, :float_millisecond)
      @inside = 0
      @requests = 0
    end

    def check_reset
      now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      return if now < @next_check

      @next_check = now + 0.2
      mtime = File.mtime(File.join(@dir, "reset")) rescue nil
      return if mtime.nil? || mtime == @reset_seen

      @reset_seen = mtime
      zero
    end

    def write
      return if @requests.zero?

      File.write(File.join(@dir, "gc-#{Process.pid}.json"),
                 JSON.generate(requests: @requests, gc_total: GC.count - @base, gc_inside: @inside,
                               gc_major: GC.stat(:major_gc_count) - @base_major,
                               gc_ms: GC.stat(:time) - @base_time,
                               cpu_ms: Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID, :float_millisecond) - @base_cpu))
    end
  end
end
