# frozen_string_literal: true

# The GC-heavy app for bench/oobgc.rb: a heap like a booted app's (long-lived
# strings, hashes and arrays of several sizes), and requests that allocate
# tens of thousands of short-lived objects each, as a page render does.
require "json"
require_relative "probe_files"

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
  # OOBGC_MALLOC_KB=N: each request also builds an N KiB string (malloc'd,
  # not object slots), as a rendered page or an upload buffer is.
  MALLOC = Integer(ENV.fetch("OOBGC_MALLOC_KB", "0")) * 1024
  # OOBGC_GROW=N: each request adds N rows to a cache that is never pruned,
  # so the live heap grows for as long as the worker runs.
  GROW = Integer(ENV.fetch("OOBGC_GROW", "0"))
  CACHE = []
  # OOBGC_MIX="rows:weight,...": each request draws its row count from
  # these weights instead of OOBGC_ROWS, as an app whose pages differ in
  # size does (a few large reports among many small pages). Seeded per
  # process, so every run draws the same sequence.
  MIX = ENV.fetch("OOBGC_MIX", "").split(",").flat_map do |pair|
    rows, weight = pair.split(":").map { |v| Integer(v) }
    [rows] * weight
  end
  DRAW = Random.new(42)
  # The probe ignores each worker's first SKIP requests (warm-up).
  SKIP = Integer(ENV.fetch("OOBGC_SKIP", "100"))

  def self.render
    count = MIX.empty? ? ROWS : MIX[DRAW.rand(MIX.size)]
    rows = Array.new(count) do |i|
      { "id" => i, "name" => "row #{i}", "tags" => %w[a b c].map { |t| "#{t}#{i}" }, "text" => "lorem ipsum " * (i % 8) }
    end
    if KEEP.positive?
      RECENT << rows
      RECENT.shift while RECENT.size > KEEP
    end
    CACHE.concat(rows.first(GROW).map(&:dup)) if GROW.positive?
    size = JSON.generate(rows).bytesize
    size += ("x" * MALLOC).bytesize if MALLOC.positive?
    size.to_s
  end

  # Counts, independently of Memkit::OobGC, how many GC runs happen while a
  # request is being served and how many in all; the workers write the figures
  # (and their RSS) to DIR/gc-PID.json when they exit. They start counting at
  # each worker's SKIP+1st request; touching DIR/reset zeroes them too
  # (checked every 0.2 s). Single-threaded servers only.
  # Puma configs also call Probe.flush from their worker-shutdown hook
  # (bench/probe_files.rb says why).
  class Probe
    extend ProbeFiles

    def initialize(app, dir)
      @app = app
      @dir = dir
      @reset_seen = nil
      @next_check = 0
      @seen = 0
      zero
      Probe.track(self)
    end

    def call(env)
      check_reset
      @seen += 1
      zero(seen: @seen) if @seen == SKIP + 1
      before = GC.count
      major = GC.stat(:major_gc_count)
      response = @app.call(env)
      @inside += GC.count - before
      @inside_major += GC.stat(:major_gc_count) - major
      @requests += 1
      response
    end

    # A worker that served no request since the last reset has only warm-up
    # figures: it writes nothing.
    def write
      return if @requests.zero?

      mtime = File.mtime(File.join(@dir, "reset")) rescue nil
      return if mtime && mtime != @reset_seen

      ProbeFiles.write(File.join(@dir, "gc-#{Process.pid}.json"),
                       requests: @requests, gc_total: GC.count - @base, gc_inside: @inside, gc_inside_major: @inside_major,
                       gc_major: GC.stat(:major_gc_count) - @base_major,
                       gc_ms: GC.stat(:time) - @base_time, skipped: @seen - @requests,
                       rss_kb: File.read("/proc/self/status")[/VmRSS:\s+(\d+)/, 1].to_i,
                       oob: defined?(Memkit::OobGC::Counters) ? oob_stats : nil,
                       cpu_ms: Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID, :float_millisecond) - @base_cpu)
    end

    private

    def zero(seen: 0)
      @seen = seen
      @base = GC.count
      @base_major = GC.stat(:major_gc_count)
      @base_time = GC.stat(:time)
      @base_cpu = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID, :float_millisecond)
      @base_grow = defined?(Memkit::OobGC::Counters) ? Memkit::OobGC.stats.grow_runs : 0
      @inside = 0
      @inside_major = 0
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

    def oob_stats
      s = Memkit::OobGC.stats
      { grow_runs: s.grow_runs, grow_runs_counted: s.grow_runs - @base_grow, heap_grown_bytes: s.heap_grown_bytes,
        heap_bytes: s.heap_bytes, gave_up: s.gave_up, boot_env: s.boot_env, policy: s.policy }
    end
  end
end
