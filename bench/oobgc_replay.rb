# frozen_string_literal: true

# Replays requests through Memkit::OobGC's trigger, to compare reserves on
# the very same requests: a live bench spreads by 10% from run to run as the
# workers share the page mix differently.
#
#   flock /tmp/memkit-bench.lock script/ruby34 bundle exec ruby bench/oobgc_rails.rb \
#       --modes none --record tmp/bench/requests        # the Rails app's requests
#   ruby bench/oobgc_replay.rb [--free N,N,...] [--skip 100] tmp/bench/requests/req-none-*.log
#   ruby bench/oobgc_replay.rb --synthetic              # seeded request sizes with tails
#
# Each log is one worker's requests, one line each: objects allocated per
# size pool. From the --skip+1st request on (the ones before teach the
# Profile), Ruby alone collects when a request finds a pool it allocates in
# with no free slot left; each rule collects between requests once a pool
# holds less than its reserve, learned from the requests before, and inside
# a request that finds a pool empty all the same. Every cycle starts with
# `free` slots per pool: by default what OobGC sizes a heap for, COVER + 1
# reserves (Policy#reserve) of the requests' 95th percentile, the slack
# what the largest went past it. Prints per
# rule the GC runs against Ruby alone's and the share out of requests.
$LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
require "memkit/oob_gc"
require "optparse"

module OobgcReplay
  Policy = Memkit::OobGC::Policy
  HEADROOM = Memkit::OobGC::Collector::DEFAULTS.fetch(:headroom)
  WINDOW = 200

  # name => ->(policy, profile, recent, pool) { free slots below which it collects }; `recent`: per
  # pool, the objects of the last WINDOW requests.
  RULES = {
    "memkit" => lambda do |policy, profile, _recent, i|
      policy.reserve(profile.objects.fetch(i), HEADROOM, profile.beyond[i])
    end,
    "1,000 slots of slack" => ->(policy, profile, _recent, i) { policy.reserve(profile.objects.fetch(i), HEADROOM) },
    "1.1x or largest + 100" => lambda do |_policy, profile, recent, i|
      [profile.objects.fetch(i) * HEADROOM, recent[i].max].min + 100
    end,
    "98th percentile + 100" => ->(_policy, _profile, recent, i) { rank(recent[i], 0.98) + 100 },
    "largest + 100" => ->(_policy, _profile, recent, i) { recent[i].max + 100 }
  }.freeze

  # Request sizes with tails: [share of large requests, their size as a
  # multiple of the others' (range)]; the others allocate 500-1,500 objects
  # in one pool and a third of that in another.
  SYNTHETIC = { "uniform" => [0.0, 1..1], "5% 2-4x" => [0.05, 2.0..4.0], "2% 2-8x" => [0.02, 2.0..8.0],
                "20% 1.5-2.5x" => [0.2, 1.5..2.5] }.freeze

  module_function

  def rank(values, share) = values.max(values.size - [(values.size * share).ceil - 1, 0].max).last

  def synthetic(share, multiple, seed, count = 3_000)
    rng = Random.new(seed)
    Array.new(count) do
      size = rng.rand(500..1_500).to_f
      size *= rng.rand(multiple) if rng.rand < share
      [size.round, (size / 3).round]
    end
  end

  # Slots per pool a heap sized by OobGC keeps free after a GC.
  def sized(requests, policy)
    requests.transpose.map do |column|
      need = rank(column, 0.95)
      next 0 unless need.positive?

      ((Memkit::OobGC::Collector::COVER + 1) * policy.reserve(need, HEADROOM, column.max - need)).ceil
    end
  end

  # [GC runs, of them out of requests] over `requests` after the first `skip`.
  def replay(requests, free0, skip:, rule: nil, policy: nil)
    profile = Memkit::OobGC::Profile.new
    recent = Array.new(free0.size) { [] }
    free = free0.dup
    runs = 0
    out = 0
    requests.each_with_index do |objects, k|
      counted = k >= skip
      if rule && !profile.empty? && short?(free, profile, recent, rule, policy)
        runs += 1 if counted
        out += 1 if counted
        free = free0.dup
      end
      if objects.each_with_index.any? { |n, i| n > free.fetch(i, 0) }
        runs += 1 if counted
        free = free0.zip(objects).map { |f, n| f - n }
      else
        free = free.zip(objects).map { |f, n| f - n }
      end
      profile.record(objects, 0)
      recent.each_with_index do |column, i|
        column << objects.fetch(i, 0)
        column.shift if column.size > WINDOW
      end
    end
    [runs, out]
  end

  def short?(free, profile, recent, rule, policy)
    profile.objects.each_with_index.any? do |need, i|
      need.positive? && free.fetch(i, 0) < rule.call(policy, profile, recent, i)
    end
  end

  def line(name, runs, out, base)
    format("  %-24s %4d GC runs, %.3fx Ruby alone, %5.1f%% out of requests", name, runs, runs.fdiv(base),
           100.0 * out / runs)
  end

  # Replays each worker's requests (name => requests); prints and returns
  # the totals per rule.
  def compare(title, workers, opts, policy)
    totals = Hash.new { |h, k| h[k] = [0, 0] }
    workers.each do |name, requests|
      next if requests.size <= opts[:skip]

      free0 = opts[:free] || sized(requests.drop(opts[:skip]), policy)
      alone, = replay(requests, free0, skip: opts[:skip])
      totals["Ruby alone"][0] += alone
      counted = requests.size - opts[:skip]
      puts format("%s: %d requests, %s free after a GC; Ruby alone %d GC runs (%.1f requests each)",
                  name, counted, free0.join("/"), alone, counted.fdiv(alone))
      RULES.each do |rule_name, rule|
        runs, out = replay(requests, free0, skip: opts[:skip], rule: rule, policy: policy)
        totals[rule_name][0] += runs
        totals[rule_name][1] += out
        puts line(rule_name, runs, out, alone)
      end
    end
    base = totals.delete("Ruby alone")[0]
    puts "#{title}, all workers: Ruby alone #{base} GC runs"
    totals.each { |name, (runs, out)| puts line(name, runs, out, base) }
    puts
  end

  def main(argv)
    opts = { skip: 100, free: nil, synthetic: false }
    files = OptionParser.new do |o|
      o.banner = "usage: ruby bench/oobgc_replay.rb [--free N,N,...] [--skip N] (LOG... | --synthetic)"
      o.on("--free LIST", Array, "free slots per pool after each GC") { |v| opts[:free] = v.map { |x| Integer(x) } }
      o.on("--skip N", Integer, "requests that only teach the profile (default 100)") { |v| opts[:skip] = v }
      o.on("--synthetic", "seeded request sizes with tails, two workers each") { opts[:synthetic] = true }
    end.parse(argv)
    if files.empty? && !opts[:synthetic]
      abort "no request logs given (bench/oobgc_rails.rb --record DIR), nor --synthetic"
    end

    policy = Policy::SizePools.new(headroom: HEADROOM)
    puts "oobgc_replay: #{RUBY_DESCRIPTION}; #{Time.now.utc.strftime('%F %T')} UTC"
    unless files.empty?
      workers = files.to_h { |f| [File.basename(f), File.readlines(f).map { |l| l.split.map { |x| Integer(x) } }] }
      compare("recorded", workers, opts, policy)
    end
    return unless opts[:synthetic]

    SYNTHETIC.each do |name, (share, multiple)|
      workers = (1..2).to_h { |seed| ["#{name} ##{seed}", synthetic(share, multiple, seed)] }
      compare(name, workers, opts, policy)
    end
  end
end

OobgcReplay.main(ARGV) if $PROGRAM_NAME == __FILE__
