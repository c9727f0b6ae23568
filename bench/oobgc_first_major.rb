# frozen_string_literal: true

# What a forked worker's first major GC costs against its later ones: a
# parent holding ~800,000 objects (all old after four majors) forks, and
# the child times two majors in a row, with the minor page faults of the
# first (the copy-on-write of memory the parent shares). The ratio depends
# on the machine: 5-8x on one of the bench VMs (Ruby 3.1, 3.3 and 3.4, mostly
# user time), 1.5x on the next (docs/BENCHMARKS.md, "a forked worker's first
# major" and "A new VM").
#
#   bundle exec ruby bench/oobgc_first_major.rb [ROUNDS]     (script/ruby33, script/ruby34 alike)
ROUNDS = Integer(ARGV.fetch(0, 3))

def timed
  cpu = Process.times
  start = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  yield
  now = Process.times
  format("%6.1f ms (user %3d, sys %3d)", (Process.clock_gettime(Process::CLOCK_MONOTONIC) - start) * 1000,
         ((now.utime - cpu.utime) * 1000).round, ((now.stime - cpu.stime) * 1000).round)
end

def minflt = File.read("/proc/self/stat").split[9].to_i

keep = Array.new(200_000) { |i| [i.to_s, { k: i }, "x" * (i % 40)] }
4.times { GC.start(full_mark: true) }
puts "#{RUBY_DESCRIPTION}; #{GC.stat(:heap_live_slots)} live slots"
ROUNDS.times do |round|
  puts format("round %d parent major:        %s", round, timed { GC.start(full_mark: true) })
  pid = fork do
    faults = minflt
    first = timed { GC.start(full_mark: true) }
    first_faults = minflt - faults
    second = timed { GC.start(full_mark: true) }
    puts format("        child's first major: %s, %d faults; second: %s", first, first_faults, second)
  end
  Process.wait(pid)
end
keep.size
