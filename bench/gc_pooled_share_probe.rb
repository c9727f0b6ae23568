# frozen_string_literal: true

# Ruby 3.4+ with full marks off: how many 40-byte objects allocation takes
# before Ruby starts a GC, against the free slots GC.stat_heap shows once a
# minor's sweep is done, when that sweep leaves the pool under Ruby's free
# minimum and so asks for a major (:nofree), which then stays pending. The
# shortfall is what the sweep pooled for the major's incremental mark.
#
#   script/ruby34 ruby bench/gc_pooled_share_probe.rb [GARBAGE_EVERY ...]
#
# GARBAGE_EVERY: one young object in N is garbage at the minor (default 5,
# 10 and 20; 3 leaves the pool over its minimum: nothing pending).
abort "needs GC.config (Ruby 3.4+)" unless GC.respond_to?(:config)

GC.config(rgengc_allow_full_mark: false)
def pool0_free = (h = GC.stat_heap(0); h[:heap_eden_slots] - (h[:total_allocated_objects] - h[:total_freed_objects]))

(ARGV.empty? ? [3, 5, 10, 20] : ARGV.map { Integer(_1) }).each do |every|
  pid = fork do
    old = Array.new(300_000) { Object.new }
    4.times { GC.start(full_mark: false) } # old, and past RVALUE_OLD_AGE minors since the last major
    young = []
    1_500_000.times { |i| o = Object.new; young << o unless (i % every).zero? }
    GC.start(full_mark: false, immediate_sweep: true)
    need = GC.latest_gc_info(:need_major_by)
    free = pool0_free
    count = GC.count
    taken = 0
    (Object.new; taken += 1) while GC.count == count
    printf("%s 1 in %-2d garbage: need_major_by %-8p 40-byte pool shows %7d free, took %7d before a GC: %4.1f%% kept back\n",
           RUBY_VERSION, every, need, free, taken, 100.0 * (free - taken) / free)
    old.size + young.size
  end
  Process.wait(pid)
end
