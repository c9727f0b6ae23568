# frozen_string_literal: true

# Which pages a forked Rails worker makes its own, by what they hold: boots
# bench/rails in this process (as bench/cow_rails_lab.rb does), prepares as
# MODE says, forks 4 children that each serve N requests in-process
# (bench/cow_rails.rb's mix) and run a full GC, then compares page frames
# (/proc/PID/pagemap) of the master and the children. A child's private page
# is one whose frame no other process of the tree maps. Each is put in one
# class by its address:
#   ruby heap body     inside a 16 KiB Ruby heap page (object slots)
#   heap_page struct   a brk-heap page holding a `struct heap_page` (the GC's
#                      per-page bookkeeping and mark bitmaps, calloc'd apart
#                      from the page body on Ruby 3.1/3.2)
#   brk other          the rest of the brk heap (malloc arena 0)
#   anon other         other anonymous mappings (malloc arenas, large mallocs)
#   file / stack       file-backed mappings; stacks
# The master's pages none of the children map with the same frame are split
# the same way, and by whether the children still share one frame among
# themselves there (the master wrote after fork) or each has its own (each
# child wrote it).
#
#   BUNDLE_GEMFILE=bench/rails/Gemfile bundle exec ruby bench/cow_rails_pages.rb MODE [REQUESTS]
#
# --server unicorn|puma MODE [REQUESTS]: the same split on a real server
# (bench/cow_rails.rb boots it; MODE as there), by mapping only (brk heap,
# anonymous, file, stack), after REQUESTS per worker and a full GC in each.
#   bundle exec ruby bench/cow_rails_pages.rb --server unicorn memkit 100
require_relative "cow_rails"
require "fiddle"

module LivePages
  module_function

  def frames(pid)
    out = {}
    Memkit::Cow.frames(pid).each do |start, _, entries|
      entries.each_with_index do |v, i|
        out[start + i * 4096] = v & Memkit::Cow::PFN_MASK if v & Memkit::Cow::PRESENT != 0
      end
    end
    out
  end

  def maps(pid)
    File.readlines("/proc/#{pid}/maps").map do |line|
      f = line.split(" ", 6)
      s, e = f[0].split("-").map { |x| x.to_i(16) }
      [s, e, f[5].to_s.strip]
    end
  end

  def kind(ranges, addr)
    _, _, path = ranges.find { |s, e, _| addr >= s && addr < e }
    case path
    when "[heap]" then "brk"
    when "", nil, /\A\[anon/ then "anon"
    when /\[stack/ then "stack"
    else "file"
    end
  end

  def run(name, mode, requests)
    server = CowRails.start(name, mode)
    CowRails.drive(server, requests) if requests.positive?
    CowRails.gc_all(server)
    workers = CowRails.workers_of(server.pid)
    master = frames(server.pid)
    children = workers.map { |w| frames(w) }
    ranges = maps(server.pid)
    sharers = Hash.new(0)
    ([master] + children).each { |f| f.each_value { |pfn| sharers[pfn] += 1 } }
    mb = ->(pages) { format("%.1f", pages * 4096 / 1e6) }
    puts "#{name} #{mode}, #{requests} requests per worker and a full GC, ruby #{RUBY_VERSION}"
    children.each_with_index do |c, k|
      h = Hash.new(0)
      c.each { |a, pfn| h[kind(ranges, a)] += 1 if sharers[pfn] == 1 }
      puts "worker #{k} private MB: #{h.sort.map { |kk, v| "#{kk} #{mb.(v)}" }.join(', ')}; total #{mb.(h.values.sum)}"
    end
    why = Hash.new { |hh, kk| hh[kk] = Hash.new(0) }
    master.each do |a, pfn|
      next unless sharers[pfn] == 1

      theirs = children.map { |c| c[a] }.compact
      reason = if theirs.empty? then "no worker maps it"
               elsif theirs.uniq.size < theirs.size then "the master wrote after fork"
               else "every worker has its own copy"
               end
      why[reason][kind(ranges, a)] += 1
    end
    why.each do |reason, h|
      puts "master private, #{reason}: #{mb.(h.values.sum)} MB (#{h.sort.map { |kk, v| "#{kk} #{mb.(v)}" }.join(', ')})"
    end
    puts format("tree pss %.1f MB", Memkit::Tree.read(server.pid).total_pss / 1e6)
  ensure
    CowRails.stop(server) if server
  end
end

if ARGV[0] == "--server"
  LivePages.run(ARGV.fetch(1), ARGV.fetch(2), Integer(ARGV.fetch(3, "100")))
  exit
end
mode = ARGV.fetch(0)
requests = Integer(ARGV.fetch(1, "300"))
app, flags = CowRails.in_process(mode)
# "+holes": fill the malloc arena's free chunks (Memkit::Warmup's malloc fill) after the rest
if flags.include?("holes")
  info = Memkit::Libc.mallinfo2
  filled = Memkit::Warmup.send(:fill_malloc_holes)
  warn format("holes: %.1f MB free in the arena before, %.1f MB filled", info.fordblks / 1e6, filled / 1e6)
end
# PAGES_PRE: what the master does last before forking: "gc" a full GC,
# "gc3" a full GC and two minor ones
case ENV["PAGES_PRE"]
when "gc" then GC.start(full_mark: true, immediate_sweep: true)
when "gc3" then 3.times { |i| GC.start(full_mark: i.zero?, immediate_sweep: true) }
end

module PageClasses
  PAGE = 4096
  BODY = GC::INTERNAL_CONSTANTS.fetch(:HEAP_PAGE_SIZE)
  STRUCT = 400 # sizeof(struct heap_page) on 3.1 is about 340 bytes; the page(s) it touches

  module_function

  # Ruby heap page bodies (by the objects ObjectSpace walks) and, from each
  # body's header, its struct heap_page's address.
  def heap_pages
    bodies = {}
    ObjectSpace.each_object(BasicObject) { |o| bodies[Fiddle.dlwrap(o) & ~(BODY - 1)] = true }
    bodies.keys.to_h { |b| [b, Fiddle::Pointer.new(b)[0, 8].unpack1("Q")] }
  end

  def classifier(pid, bodies)
    body_pages = {}
    bodies.each_key { |b| (0...BODY / PAGE).each { |k| body_pages[b + k * PAGE] = true } }
    struct_pages = {}
    bodies.each_value do |s|
      struct_pages[s & ~(PAGE - 1)] = true
      struct_pages[(s + STRUCT) & ~(PAGE - 1)] = true
    end
    ranges = LivePages.maps(pid)
    lambda do |addr|
      next "ruby heap body" if body_pages[addr]
      next "heap_page struct" if struct_pages[addr]

      kind = LivePages.kind(ranges, addr)
      %w[brk anon].include?(kind) ? "#{kind} other" : kind
    end
  end
end

bodies = PageClasses.heap_pages
# PAGES_GC: full (default), minor, or none: what the child's GC alone writes
CowRails.in_process_children(app, requests, gc: ENV.fetch("PAGES_GC", "full")) do |pids|
  master = LivePages.frames(Process.pid)
  children = pids.map { |pid| LivePages.frames(pid) }
  sharers = Hash.new(0)
  ([master] + children).each { |f| f.each_value { |pfn| sharers[pfn] += 1 } }
  classify = PageClasses.classifier(Process.pid, bodies)
  mb = ->(pages) { format("%6.1f", pages * PageClasses::PAGE / 1e6) }
  puts format("%s, %d requests per child, ruby %s: %d heap pages (%s MB of bodies)", mode, requests, RUBY_VERSION,
              bodies.size, mb.(bodies.size * PageClasses::BODY / PageClasses::PAGE))
  private_by = pids.each_with_index.map do |_, k|
    counts = Hash.new(0)
    children[k].each { |addr, pfn| counts[classify.(addr)] += 1 if sharers[pfn] == 1 }
    counts
  end
  classes = ["ruby heap body", "heap_page struct", "brk other", "anon other", "stack", "file"]
  puts "child private MB (each child; mean):"
  classes.each do |c|
    per = private_by.map { |h| h[c] }
    puts format("  %-18s %s   mean %s", c, per.map { |n| mb.(n) }.join(" "), mb.(per.sum / 4.0))
  end
  puts format("  %-18s %s", "total", private_by.map { |h| mb.(h.values.sum) }.join(" "))
  # The master's pages no child maps with its frame.
  master_only = Hash.new { |h, k| h[k] = Hash.new(0) }
  master.each do |addr, pfn|
    next unless sharers[pfn] == 1

    theirs = children.map { |f| f[addr] }
    kind = if theirs.none? then "children do not map it"
           elsif theirs.compact.uniq.size < theirs.compact.size then "master wrote (children share the old frame)"
           else "every child wrote its own copy"
           end
    master_only[kind][classify.(addr)] += 1
  end
  puts "master private MB, by why:"
  master_only.each do |kind, counts|
    puts format("  %-45s %s MB: %s", kind, mb.(counts.values.sum),
                counts.sort_by { |_, n| -n }.map { |c, n| "#{c} #{mb.(n).strip}" }.join(", "))
  end
  tree = Memkit::Tree.read(Process.pid)
  puts format("tree pss %.1f MB", tree.total_pss / 1e6)
end
