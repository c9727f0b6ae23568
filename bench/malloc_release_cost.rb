# frozen_string_literal: true

# What Memkit::MallocRelease costs after a major GC: the malloc_trim(0)
# itself, and the page faults when the next requests reuse the pages it gave
# back, for several amounts of garbage. Each size runs in a fresh child.
#
#   flock /tmp/memkit-bench.lock bundle exec ruby bench/malloc_release_cost.rb [--mb 10,50,100]
$LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
require "memkit"
require "optparse"

sizes = [10, 50, 100]
OptionParser.new { |o| o.on("--mb LIST", Array) { |v| sizes = v.map { |s| Integer(s) } } }.parse!(ARGV)

def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

# Buffers of 600-1,400 bytes, one in 20 kept: the freed chunks lie between
# live ones, as a request's garbage does.
def garbage(megabytes)
  count = megabytes * 1_000_000 / 1_000
  bufs = Array.new(count) { |i| "x" * (600 + (i % 800)) }
  Array.new(count / 20) { |i| bufs[i * 20] }
end

abort "no malloc_trim here" unless Memkit::Libc.malloc_trim?
puts "malloc_release_cost: ruby #{RUBY_VERSION}"
puts format("%8s %10s %10s %12s %14s", "garbage", "free_MB", "trim_ms", "rss_back_MB", "refault_ms")
sizes.each do |mb|
  r, w = IO.pipe
  pid = fork do
    r.close
    GC.disable # one GC, the one measured
    kept = garbage(mb)
    GC.enable
    GC.start(full_mark: true, immediate_sweep: true)
    free = Memkit::Libc.mallinfo2.fordblks
    rss = Memkit.rss
    t = now
    Memkit::Libc.malloc_trim
    trim = now - t
    back = rss - Memkit.rss
    # The same garbage again: the time over a run without a trim before it
    # is the page faults.
    t = now
    again = garbage(mb)
    refault = now - t
    GC.start(full_mark: true, immediate_sweep: true)
    again = nil
    t = now
    again = garbage(mb)
    warm = now - t
    w.write(format("%6d MB %10.1f %10.2f %12.1f %14.1f\n", mb, free / 1e6, trim * 1000, back / 1e6,
                   (refault - warm) * 1000))
    w.close
    exit!(kept.size.positive? && again.size.positive? ? 0 : 1)
  end
  w.close
  print r.read
  Process.wait(pid)
end
puts "refault_ms = time to allocate the same garbage again after the trim, minus the time without one"
