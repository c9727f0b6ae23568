# frozen_string_literal: true

# memkit doctor's probe: `ruby --disable-gems lib/memkit/doctor/probe.rb FIBERS`
# prints one JSON object with what this Ruby build does, measured rather than
# assumed from its version. Memkit::Doctor::ProbeRunner starts it with the
# target's Ruby binary and the target's RUBY_*/MALLOC_* environment, so it
# may be a different Ruby from memkit's: it uses nothing but core Ruby and
# json, and never loads memkit. Requiring this file does nothing.
return unless $PROGRAM_NAME == __FILE__

require "json"
count = Integer(ARGV[0])
PAGE = 4096
def stack_memory
  rss = lazy = 0
  prev = cur = nil
  File.foreach("/proc/self/smaps") do |line|
    if (m = line.chomp.match(/\A(\h+)-(\h+) (\S{4}) \h+ \S+ \d+ *(.*)\z/))
      prev = cur
      cur = { start: m[1].to_i(16), finish: m[2].to_i(16), perms: m[3], path: m[4] }
      # Fiber and thread stacks: anonymous, directly above a PROT_NONE guard page.
      cur[:stack] = cur[:path].empty? && prev && prev[:perms].start_with?("---") && prev[:path].empty? &&
                    prev[:finish] == cur[:start]
    elsif cur && cur[:stack] && (f = line.match(/\A(Rss|LazyFree):\s+(\d+) kB/))
      f[1] == "Rss" ? rss += f[2].to_i * 1024 : lazy += f[2].to_i * 1024
    end
  end
  [rss, lazy]
end
def rss = File.read("/proc/self/statm").split[1].to_i * PAGE
def vsize = File.read("/proc/self/statm").split[0].to_i * PAGE
def maps = File.read("/proc/self/maps").count("\n")
def deep(n) = n.zero? ? Fiber.yield : deep(n - 1)

params = defined?(RubyVM::DEFAULT_PARAMS) ? RubyVM::DEFAULT_PARAMS : {}
consts = defined?(GC::INTERNAL_CONSTANTS) ? GC::INTERNAL_CONSTANTS : {}
features = {
  process_warmup: Process.respond_to?(:warmup),
  gc_compact: GC.respond_to?(:compact),
  gc_auto_compact: GC.respond_to?(:auto_compact),
  size_pools: consts[:SIZE_POOL_COUNT] || consts[:HEAP_COUNT],
  yjit: defined?(RubyVM::YJIT) ? RubyVM::YJIT.enabled? : false
}

# Young objects after fork: a child runs one minor GC; how much of the
# heap holding them does it copy?
age = begin
  GC.start
  GC.start
  objects = Array.new(100_000) { Object.new }
  slot = consts[:RVALUE_SIZE] || consts[:BASE_SLOT_SIZE] || 40
  r, w = IO.pipe
  r2, w2 = IO.pipe
  child = fork do
    r.close
    w2.close
    w.write("a")
    r2.read(1)
    GC.start(full_mark: false)
    w.write("b")
    r2.read(1)
    exit!(0)
  end
  w.close
  r2.close
  dirty = -> { File.read("/proc/#{child}/smaps_rollup")[/^Private_Dirty:\s+(\d+)/, 1].to_i * 1024 }
  r.read(1)
  before = dirty.call
  w2.write("x")
  r.read(1)
  after = dirty.call
  w2.write("x")
  Process.wait(child)
  { objects: objects.size, heap_bytes: objects.size * slot, dirtied: after - before }
rescue StandardError, NotImplementedError => e
  { error: "#{e.class}: #{e.message}" }
end
objects = nil

# Fiber stacks: make `count` fibers that each use some stack, let them
# finish, collect them, and see whether the stacks' memory went back.
GC.start
base_rss, = stack_memory
rss0 = rss
vsize0 = vsize
maps0 = maps
fibers = Array.new(count) { Fiber.new { deep(100) }.tap(&:resume) }
peak_rss, = stack_memory
per_rss = (rss - rss0) / count
per_vsize = (vsize - vsize0) / count
per_maps = ((maps - maps0).to_f / count).round(2)
fibers.each(&:resume)
fibers = nil
GC.start
GC.start
after_rss, lazy = stack_memory
grown = peak_rss - base_rss
release =
  if grown <= 0 then "unknown"
  elsif after_rss - base_rss <= grown / 2 then "returned"
  elsif lazy >= grown / 2 then "lazy"
  else "kept"
  end
puts JSON.generate(
  description: RUBY_DESCRIPTION, features: features, age: age,
  fiber: {
    count: count, vm_stack_size: params[:fiber_vm_stack_size], machine_stack_size: params[:fiber_machine_stack_size],
    rss_per_fiber: per_rss, address_space_per_fiber: per_vsize, mappings_per_fiber: per_maps,
    base_rss: base_rss, peak_rss: peak_rss, after_rss: after_rss, lazy_free: lazy, release: release
  }
)
