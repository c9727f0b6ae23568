# frozen_string_literal: true

require_relative "memkit/version"
require_relative "memkit/errors"
require_relative "memkit/proc_fs"
require_relative "memkit/units"
require_relative "memkit/memory"
require_relative "memkit/status"
require_relative "memkit/tree"
require_relative "memkit/mappings"

# memkit: make forking Ruby servers share more memory, and show where it goes.
module Memkit
  # Loaded on first use, so `require "memkit"` stays cheap for a server that
  # only wants Memkit.rss.
  autoload :Warmup, File.expand_path("memkit/warmup", __dir__)
  autoload :OobGC, File.expand_path("memkit/oob_gc", __dir__)
  autoload :MemoryLimit, File.expand_path("memkit/memory_limit", __dir__)
  autoload :Metrics, File.expand_path("memkit/metrics", __dir__)
  autoload :Soak, File.expand_path("memkit/soak", __dir__)
  autoload :FiberPool, File.expand_path("memkit/fiber_pool", __dir__)
  autoload :Doctor, File.expand_path("memkit/doctor", __dir__)
  autoload :Cgroup, File.expand_path("memkit/cgroup", __dir__)
  autoload :Allocator, File.expand_path("memkit/allocator", __dir__)
  autoload :Libc, File.expand_path("memkit/libc", __dir__)
  autoload :Refork, File.expand_path("memkit/refork", __dir__)
  autoload :MallocRelease, File.expand_path("memkit/malloc_release", __dir__)

  module_function

  # Prepares the heap so that forked children keep sharing it; see Memkit::Warmup.
  def warmup(**options)
    Warmup.run(**options)
  end

  # Resident set size in bytes, from /proc/PID/statm: a few microseconds,
  # cheap enough for every request. Counts shared pages in full.
  def rss(pid = Process.pid)
    pid = ProcFS.pid!(pid) unless pid.is_a?(Integer) && pid.positive?
    statm = File.read("/proc/#{pid}/statm")
    space = statm.index(" ") or raise ParseError, "/proc/#{pid}/statm: #{statm.inspect[0, 40]}"
    statm[space + 1, 20].to_i * ProcFS::PAGE_SIZE
  rescue SystemCallError => e
    raise ProcFS.translate(e, pid, "statm")
  end

  # Memkit::Memory (rss, pss, uss, shared and private, swap) from one read of
  # /proc/PID/smaps_rollup, or smaps on kernels older than 4.14.
  def memory(pid = Process.pid, source: :auto)
    Memory.read(ProcFS.pid!(pid), source: source)
  end

  # Memkit::Tree: pid and its descendants with their memory and totals.
  def tree(pid = Process.pid)
    Tree.read(pid)
  end

  # Memkit::Mappings: memory grouped by kind of mapping.
  def mappings(pid = Process.pid)
    Mappings.read(pid)
  end
end
