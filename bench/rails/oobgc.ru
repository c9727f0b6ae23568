# frozen_string_literal: true

# rackup file for bench/oobgc_rails.rb: the bench Rails app, preloaded in the
# master, with a GC probe outermost and, when OOBGC=1, `use Memkit::OobGC`
# (default options) between the probe and Rails; OOBGC_PATCH names a file
# loaded after memkit (a prototype change, measured without editing lib/).
#
# The probe counts, per worker, from its OOBGC_SKIP+1st request: requests,
# GC runs in all, GC runs (and majors) that started and ended inside a
# request. Each worker writes them, with its RSS and Memkit::OobGC.stats, to
# OOBGC_DIR/gc-PID.json when the bench sends SIGPWR, when it exits, and, on
# Puma, from the shutdown hook (puma.rb: a Puma worker's at_exit can be cut
# short by its exit! once the master has gone). Single-threaded workers only.
#
# For the RSS and GC-count diagnosis it also keeps: why each GC inside a
# request ran (GC.latest_gc_info's gc_by and major_by after it; the last one
# where a request saw several), the worker's RSS sampled every SAMPLE
# requests (mean and largest), and at exit what the RSS is made of: the
# object heap's pages, and glibc's malloc arenas (mallinfo2) where present.
#
# OOBGC_RECORD names a directory where each worker writes one line per
# request (Ruby 3.2+): the objects it allocated in each size pool, as
# bench/oobgc_replay.rb reads them.
require "json"
require "memkit/libc"
require_relative "../probe_files"
require_relative "app"
Rails.application.initialize!

module BenchRails
  class GcProbe
    SKIP = Integer(ENV.fetch("OOBGC_SKIP", "100"))
    SAMPLE = 25
    extend ProbeFiles

    def initialize(app, dir)
      @app = app
      @dir = dir
      @seen = 0
      @record = ENV["OOBGC_RECORD"] if POOLS
      @log = nil # the worker's record file, opened at its first request
      zero
      GcProbe.track(self)
    end

    def call(env)
      @seen += 1
      zero if @seen == SKIP + 1
      count = GC.count
      major = GC.stat(:major_gc_count)
      before = allocated_pools if @record
      response = @app.call(env)
      record(before) if @record
      if (ran = GC.count - count).positive?
        @inside += ran
        @inside_major += GC.stat(:major_gc_count) - major
        info = GC.latest_gc_info
        key = "#{info[:gc_by]}/#{info[:major_by] || 'minor'}"
        @inside_by[key] = @inside_by.fetch(key, 0) + ran
      end
      @requests += 1
      sample if (@requests % SAMPLE).zero?
      response
    end

    def write
      return if @dir.nil? || @seen <= SKIP

      oob = oob_stats
      window = oob && @oob0 && %i[oob_minor oob_major grow_runs heap_grown_bytes].to_h { |k| [k, oob[k] - @oob0[k]] }
      ProbeFiles.write(File.join(@dir, "gc-#{Process.pid}.json"), {
        requests: @requests, allocated: GC.stat(:total_allocated_objects) - @allocated,
        allocated_pools: allocated_pools&.zip(@allocated_pools)&.map { |now, base| now - base },
        gc_total: GC.count - @gc, gc_major: GC.stat(:major_gc_count) - @major,
        gc_inside: @inside, gc_inside_major: @inside_major, heap_slots: GC.stat(:heap_available_slots),
        rss_kb: File.read("/proc/self/status")[/VmRSS:\s+(\d+)/, 1].to_i, oob: oob, oob_window: window,
        inside_by: @inside_by, rss_mean_kb: @rss.empty? ? nil : @rss.sum.fdiv(@rss.size).round,
        rss_max_kb: @rss.max, memory: memory
      })
    end

    private

    def record(before)
      now = allocated_pools
      @log ||= File.open(File.join(@record, "req-#{ENV.fetch('OOBGC_MODE', 'app')}-#{Process.pid}.log"), "a")
      @log.puts(now.zip(before).map { |n, b| n - b }.join(" "))
      @log.flush
    end

    def zero
      @gc = GC.count
      @allocated = GC.stat(:total_allocated_objects)
      @allocated_pools = allocated_pools
      @major = GC.stat(:major_gc_count)
      @inside = 0
      @inside_major = 0
      @inside_by = {}
      @requests = 0
      @rss = []
      @oob0 = oob_stats
    end

    # Size pools that count their allocations (Ruby 3.3+), nil before.
    POOLS = (GC.stat_heap.size if GC.respond_to?(:stat_heap) && GC.stat_heap(0).key?(:total_allocated_objects))

    # Objects allocated per size pool so far, nil before Ruby 3.3; read one
    # count at a time (one Array, where GC.stat_heap builds a Hash per pool),
    # as it is read around each request where requests are recorded.
    def allocated_pools = (Array.new(POOLS) { |i| GC.stat_heap(i, :total_allocated_objects) } if POOLS)

    def rss_kb = File.read("/proc/self/statm").split[1].to_i * 4

    def sample = @rss << rss_kb

    def oob_stats = (Memkit::OobGC.stats.to_h if defined?(Memkit::OobGC::Counters))

    def memory
      page = GC::INTERNAL_CONSTANTS.fetch(:HEAP_PAGE_SIZE) do
        GC::INTERNAL_CONSTANTS.fetch(:HEAP_PAGE_OBJ_LIMIT, 409) * GC::INTERNAL_CONSTANTS.fetch(:RVALUE_SIZE, 40)
      end
      stat = GC.stat
      m = Memkit::Libc.mallinfo2
      { heap_pages_kb: stat.fetch(:heap_eden_pages) * page / 1024, heap_live_slots: stat.fetch(:heap_live_slots),
        heap_free_slots: stat.fetch(:heap_free_slots), malloc_limit: stat.fetch(:malloc_increase_bytes_limit),
        oldmalloc_limit: stat[:oldmalloc_increase_bytes_limit], old_objects: stat[:old_objects],
        old_objects_limit: stat[:old_objects_limit],
        malloc_arena_kb: m && (m.arena + m.hblkhd) / 1024, malloc_used_kb: m && (m.uordblks + m.hblkhd) / 1024,
        hwm_kb: File.read("/proc/self/status")[/VmHWM:\s+(\d+)/, 1].to_i, pools: pools, **smaps }
    end

    # Per size pool (Ruby 3.2+): slots in pages, pages Ruby may still add,
    # and the slots live at exit, to compare memkit's heap with the anchor's.
    def pools
      return nil unless GC.respond_to?(:stat_heap)

      GC.stat_heap.map do |_, h|
        h.slice(:slot_size, :heap_eden_slots, :heap_eden_pages, :heap_allocatable_pages, :heap_tomb_pages,
                :total_allocated_objects, :total_freed_objects, :heap_allocatable_slots)
      end
    end

    # Resident kB by kind of mapping: the brk heap (glibc's main arena),
    # anonymous mappings of 32 MB or more (Ruby 3.1's transient heap; glibc
    # arenas of other threads are 64 MB reservations), other anonymous
    # mappings (Ruby 3.3+'s object pages, mmap'd malloc blocks, stacks), files.
    def smaps
      out = Hash.new(0)
      kind = nil
      File.foreach("/proc/self/smaps") do |line|
        if (m = line.match(/\A(\h+)-(\h+) \S+ \S+ \S+ (\d+)\s*(.*)$/))
          size = m[2].hex - m[1].hex
          name = m[4].strip
          kind = if name == "[heap]" then :brk_kb
                 elsif !m[3].to_i.zero? || name.start_with?("/") then :file_kb
                 elsif size >= (32 << 20) then :anon_big_kb
                 else :anon_kb
                 end
        elsif kind && (r = line[/\ARss:\s+(\d+)/, 1])
          out[kind] += r.to_i
        end
      end
      out
    end
  end
end

use BenchRails::GcProbe, ENV.fetch("OOBGC_DIR", nil)
# The bench asks for the figures with SIGPWR once the load has stopped
# (bench/probe_files.rb says why).
# A prototype change to OobGC (bench/oobgc_rails.rb --patch), loaded over memkit's own.
require ENV["OOBGC_PATCH"] if ENV["OOBGC_PATCH"]
use Memkit::OobGC if ENV["OOBGC"] == "1"
run Rails.application
