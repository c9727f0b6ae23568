# Diagnostic config.ru (bench/demo_puma/run.rb RU=...): the demo app with a Diag middleware that keeps the last
# 4 requests' records (GC count, free slots per size pool as OobGC's policy counts them, allocatable pages,
# need_major_by, GC state, malloc counters, objects per pool the request allocated, the collector's quiet
# margins and profile) and prints them when a GC starts inside a request; GCs between requests that the
# collector did not run; GC.start/GC.compact/Process.warmup callers. It reads memkit's internals
# (ObjectSpace, instance_variable_get): a diagnostic only, never a pattern for lib/.
# TRUTH=first: at each worker's 2nd request, allocates 80-byte-slot Strings until Ruby starts a GC and prints
# how many pool 1 took against the free slots GC.stat_heap shows (TRUTH=1: once pool 1 shows < 420 free).
DIAG_A = "a".freeze
GC.singleton_class.prepend(Module.new { def start(*a, **k) = ($stderr.puts("GCSTART pid=#{$$} count=#{GC.count} #{k} #{caller.first(4).join(" < ")}"); super); def compact(*a, **k) = ($stderr.puts("GCCOMPACT pid=#{$$} count=#{GC.count} #{caller.first(4).join(" < ")}"); super) })
Process.singleton_class.prepend(Module.new { def warmup = ($stderr.puts("PWARMUP pid=#{$$} count=#{GC.count} #{caller.first(3).join(" < ")}"); super) })
# Diagnostic wrapper around the demo app: a ring of per-request records, dumped when a GC starts inside a request.
class Diag
  def initialize(app) = (@app = app)
  def col = (@col ||= ObjectSpace.each_object(Memkit::OobGC::Collector).first)
  def free = col.policy.free(Memkit::OobGC::Collector.reading)
  def alloc = Memkit::OobGC::Collector.allocated
  def call(env)
    @n = (@n || 0) + 1
    if @n == 1 then s = GC.stat; $stderr.puts "DIAG pid=#{$$} first request: count=#{GC.count} info=#{GC.latest_gc_info} need=#{GC.latest_gc_info(:need_major_by).inspect} state=#{GC.latest_gc_info(:state)} oldmalloc=#{s[:oldmalloc_increase_bytes]}/#{s[:oldmalloc_increase_bytes_limit]}" end
    @ring ||= []
    st = GC.stat
    rec = { n: @n, c0: GC.count, free0: free, alc: (0..4).map { |k| GC.stat_heap(k)[:heap_allocatable_pages] || GC.stat[:heap_allocatable_slots] },
            need: GC.latest_gc_info(:need_major_by), state: GC.latest_gc_info(:state),
            mi: st[:malloc_increase_bytes] >> 10, ml: st[:malloc_increase_bytes_limit] >> 10,
            om: st[:oldmalloc_increase_bytes] >> 10, oml: st[:oldmalloc_increase_bytes_limit] >> 10 }
    rec[:freed] = (0..4).map { |k| GC.stat_heap(k, :total_freed_objects) }
    if @prev && @prev[:c0] == rec[:c0] && @prev[:state] == :none && rec[:state] == :none
      d = rec[:freed].zip(@prev[:freed]).map { _1 - _2 }
      (@nogc_freed ||= Array.new(5, 0)).each_index { |k| @nogc_freed[k] += d[k] }
    end
    if @n % 40 == 0 then $stderr.puts "DIAG pid=#{$$} freed with no GC and no sweep under way, per pool, by request #{@n}: #{@nogc_freed.inspect} final_slots=#{GC.stat(:heap_final_slots)}" end
    if @prev && @prev[:c2] && rec[:c0] != @prev[:c2]
      $stderr.puts "DIAG pid=#{$$} GC between requests #{@n - 1} and #{@n}, not at the collector's finish: #{rec[:c0] - @prev[:c2]} #{GC.latest_gc_info.slice(:gc_by, :major_by, :need_major_by, :state)} oob=#{Memkit::OobGC.stats.to_h.slice(:oob_minor, :oob_major, :oob_hook)}"
    end
    @prev = rec
    if ENV["TRUTH"] && (ENV["TRUTH"] == "first" ? @n == 2 : rec[:free0][1] < 420) && !@dumped
      @dumped = true
      est = free; c = GC.count; a = GC.stat_heap(1, :total_allocated_objects); hold = Array.new(20_000); k = 0
      (hold[k] = DIAG_A * 40; k += 1) while GC.count == c && k < 20_000
      $stderr.puts "DIAG pid=#{$$} TRUTH at request #{@n}: estimate #{est}, pool 1 took #{GC.stat_heap(1, :total_allocated_objects) - a} before GC (#{GC.latest_gc_info.slice(:gc_by, :major_by)}); count #{c}->#{GC.count}"
      hold = nil
    end
    a0 = alloc
    r = @app.call(env)
    a1 = alloc
    rec[:req] = a1.zip(a0).map { |x, y| x - y }
    rec[:c1] = GC.count
    if rec[:c1] != rec[:c0]
      i = GC.latest_gc_info
      rec[:gc] = i.slice(:gc_by, :major_by, :need_major_by, :immediate_sweep, :state)
      rec[:freeafter] = free
    end
    (env["rack.after_reply"] ||= []) << lambda {
      q = col.instance_variable_get(:@quiet)
      rec[:c2] = GC.count
      rec[:quiet] = q && q.margins.objects
      rec[:prof] = col.profile.objects
      rec[:pend] = Memkit::OobGC::Counters.instance_variable_get(:@pending) ? 1 : 0
      rec[:hooked] = Memkit::OobGC::Counters.hooked? ? 1 : 0
      rec[:free2] = free
    }
    @ring << rec
    @ring.shift while @ring.size > 4
    if rec[:c1] != rec[:c0]
      $stderr.puts "DIAG pid=#{$$} ---- inside GC at request #{@n}"
      @ring.each { |x| $stderr.puts "DIAG pid=#{$$} #{x}" }
    end
    r
  end
end
use Diag
# frozen_string_literal: true

# memkit's sample app: boot data the workers share with the master, requests
# that allocate like a small web app does (a few thousand objects each), and
# a /leak endpoint that keeps 2 MB per request so MemoryLimit has a bloated
# worker to replace.
require "json"
require "memkit"

use Memkit::Metrics::Recorder # each worker leaves its counters for the one scrape
use Memkit::OobGC
use Memkit::MemoryLimit, max_uss: ENV.fetch("MEMKIT_DEMO_MAX_USS", "1GB")
map("/metrics") { run Memkit::Metrics.new }

CATALOG = Array.new(40_000) do |i|
  { "id" => i, "name" => "product #{i}", "tags" => %w[red green blue].rotate(i % 3), "price" => i * 0.25 }
end.freeze
INDEX = CATALOG.to_h { |item| [item["name"], item] }.freeze
LEAK = []

run lambda { |env|
  LEAK << ("x" * (2 << 20)) if env["PATH_INFO"].start_with?("/leak")
  id = env["PATH_INFO"][/\d+/].to_i % CATALOG.size
  # Rows shaped for the page, as a view or serializer builds them: the
  # short-lived objects that make a web app's GC work.
  rows = CATALOG[id, 200].map do |item|
    { "id" => item["id"], "name" => item["name"].upcase, "url" => "/products/#{item['id']}",
      "tags" => item["tags"].map(&:capitalize), "price" => format("%.2f", item["price"]) }
  end
  body = JSON.generate(rows)
  [200, { "content-type" => "application/json", "content-length" => body.bytesize.to_s }, [body]]
}
