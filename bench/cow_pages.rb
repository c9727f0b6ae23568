# frozen_string_literal: true

# Where a child's copy-on-write copies land: boots bench/cow_app.rb, prepares
# it (plain | nofill | warmup), forks a child that does WORK (gc_only |
# full_request: 2000 requests) and a full GC, then compares the two
# processes' page frames mapping by mapping: pages copied (both present,
# different frame) and pages the child no longer maps.
#
#   bundle exec ruby bench/cow_pages.rb warmup full_request
$LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
require "memkit"
require "memkit/cow"
require_relative "cow_app"

mode, work = ARGV[0] || "warmup", ARGV[1] || "gc_only"
CowApp.boot
case mode
when "plain" then nil
when "nofill" then Memkit.warmup(fill: false)
when "warmup" then Memkit.warmup
else abort "mode: plain, nofill or warmup"
end

def breakdown(master, child)
  names = File.readlines("/proc/#{master}/maps").to_h do |line|
    fields = line.split
    start, finish = fields[0].split("-").map { |x| x.to_i(16) }
    [start, "#{fields[5] || '[anon]'} (#{Memkit::Units.human(finish - start)})"]
  end
  child_pages = {}
  Memkit::Cow.frames(child).each { |s, _, entries| entries.each_with_index { |v, i| child_pages[s + i * 4096] = v } }
  rows = Hash.new { |h, k| h[k] = [0, 0, 0] }
  Memkit::Cow.frames(master).each do |start, _, entries|
    entries.each_with_index do |v, i|
      next if v & Memkit::Cow::PRESENT == 0

      c = child_pages[start + i * 4096]
      column = if c.nil? || c & Memkit::Cow::PRESENT == 0 then 1
               elsif (c & Memkit::Cow::PFN_MASK) != (v & Memkit::Cow::PFN_MASK) then 0
               else 2
               end
      rows[names[start]][column] += 4096
    end
  end
  rows
end

r, w = IO.pipe
pid = fork do
  r.close
  2000.times { CowApp.call({ "PATH_INFO" => "/" }) } if work == "full_request"
  GC.start(full_mark: true, immediate_sweep: true)
  w.write("r")
  w.close
  sleep
end
w.close
r.read(1)
# Measured by a second child: the master must not write after the fork,
# and a forked reader's own allocations only copy the reader's pages.
reader = fork do
  rows = breakdown(Process.ppid, pid)
  total = rows.values.transpose.map(&:sum)
  h = ->(b) { Memkit::Units.human(b) }
  puts "cow_pages: ruby #{RUBY_VERSION}, #{mode}, child work #{work}: master #{h.(total.sum)}, " \
       "copied #{h.(total[0])}, gone from child #{h.(total[1])}, still shared #{h.(total[2])}"
  rows.sort_by { |_, v| -(v[0] + v[1]) }.first(6).each do |name, (copied, gone, shared)|
    puts format("  %-44s copied %10s  gone %10s  shared %10s", name[0, 44], h.(copied), h.(gone), h.(shared))
  end
  $stdout.flush
  exit!(0)
end
Process.wait(reader)
Process.kill(:KILL, pid)
Process.wait(pid)
