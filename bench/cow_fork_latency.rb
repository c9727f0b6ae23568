# frozen_string_literal: true

# Fork latency with memkit/fork loaded, after the first fork, against a
# plain fork of the same heap: one process, seed 000's tree, forks
# alternating between fork(cow_friendly: false) (Ruby's own fork) and fork
# (through memkit's hook, which finds the heap unchanged). Medians, so that
# other load on the machine hits both sides alike.
#
#   bundle exec ruby bench/cow_fork_latency.rb [DEPTH=21] [PAIRS=40]
$LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
require "memkit"
require "memkit/fork"

depth = Integer(ARGV[0] || 21)
pairs = Integer(ARGV[1] || 40)
def make_tree(n) = n.positive? ? [make_tree(n - 1), make_tree(n - 1)] : []
$tree = make_tree(depth)

def time_fork(**opts)
  t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  pid = fork(**opts) { exit!(0) }
  elapsed = Process.clock_gettime(Process::CLOCK_MONOTONIC) - t
  Process.wait(pid)
  elapsed
end

first = time_fork # prepares the heap
plain = []
hooked = []
pairs.times do |i|
  # Alternate which goes first, so neither always follows a reap.
  if i.even?
    plain << time_fork(cow_friendly: false)
    hooked << time_fork
  else
    hooked << time_fork
    plain << time_fork(cow_friendly: false)
  end
end
median = ->(a) { a.sort[a.size / 2] }
puts format("ruby %s, tree depth %d (rss %s), %d pairs", RUBY_VERSION, depth, Memkit::Units.human(Memkit.rss), pairs)
puts format("first fork through memkit/fork (does the warmup): %.1f ms; skipped since: %s",
            first * 1000, Memkit::Fork.last_report.skipped)
puts format("later forks: plain median %.2f ms, memkit/fork median %.2f ms, ratio %.2fx",
            median.(plain) * 1000, median.(hooked) * 1000, median.(hooked) / median.(plain))
