# frozen_string_literal: true

# What an out-of-band GC costs in page faults: the same cell of
# bench/oobgc_matrix.rb (2 workers, wrk saturating them) without OobGC, with
# OobGC but glibc's trim left alone (malloc_pad: false), and with OobGC as it
# ships, side by side, with the workers' minor page faults per request.
#
#   flock /tmp/memkit-bench.lock script/ruby34 bundle exec ruby -Ilib bench/oobgc_faults.rb \
#     [--shapes huge,malloc,large] [--servers puma,unicorn] [--duration 8] [--repeat 2]
#
# Faults are read from /proc/PID/stat (minflt) of each worker just before
# and just after the measured run; requests, GC time and CPU time from the
# app's probe (OobgcBench::Probe), RSS at the worker's exit.
require "optparse"
require_relative "oobgc_matrix"

module OobgcFaults
  extend self

  MODES = {
    "none" => ->(src) { src },
    "memkit_nopad" => ->(src) { src.sub("use Memkit::OobGC", "use Memkit::OobGC, malloc_pad: false") },
    "memkit" => ->(src) { src }
  }.freeze

  def run(argv)
    opts = { shapes: %w[huge malloc large], servers: %w[puma unicorn], duration: 8, repeat: 1 }
    OptionParser.new do |o|
      o.on("--shapes LIST") { |v| opts[:shapes] = v.split(",") }
      o.on("--servers LIST") { |v| opts[:servers] = v.split(",") }
      o.on("--duration SECONDS", Integer) { |v| opts[:duration] = v }
      o.on("--repeat N", Integer) { |v| opts[:repeat] = v }
    end.parse!(argv)
    rows = []
    opts[:servers].product(opts[:shapes]).each do |server, shape|
      opts[:repeat].times do |rep|
        MODES.keys.rotate(rep).each do |mode|
          row = cell(server.to_sym, shape, mode, opts[:duration])
          $stderr.puts format("%s %s %s %s #%d: %.1f req/s, %d faults/req", Time.now.utc.strftime("%T"), server,
                              shape, mode, rep, row[:rps], row[:faults_per_req])
          rows << row.merge(server: server, shape: shape, mode: mode)
        end
      end
    end
    report(rows)
  end

  def cell(kind, shape, mode, duration)
    Dir.mktmpdir("memkit-oobgc-faults") do |dir|
      source = MODES.fetch(mode).call(OobgcMatrix.app_source(mode == "none" ? "none" : "memkit", dir))
      faults = {}
      out = OobgcMatrix.serve(kind, shape, source, dir, { connections: 4 }, false) do |url|
        pids = Dir[File.join(dir, "warm-*")].map { |f| Integer(f[/warm-(\d+)\z/, 1]) }
        before = pids.to_h { |pid| [pid, minflt(pid)] }
        wrk = OobgcMatrix.wrk(url, duration, { connections: 4 }, 0, false, nil)
        faults = pids.to_h { |pid| [pid, minflt(pid) - before.fetch(pid)] }
        wrk
      end
      probes = Dir[File.join(dir, "gc-*.json")].to_h do |f|
        [Integer(f[/gc-(\d+)\.json\z/, 1]), JSON.parse(File.read(f))]
      end
      counted = probes.slice(*faults.keys)
      requests = counted.values.sum { |p| p["requests"] }
      per = ->(total) { requests.zero? ? 0.0 : total.fdiv(requests) }
      { rps: OobgcBenchRunner.parse_wrk(out)[:rps],
        faults_per_req: per.(counted.keys.sum { |pid| faults.fetch(pid) }),
        cpu_ms_per_req: per.(counted.values.sum { |p| p["cpu_ms"].to_f }),
        gc_ms_per_req: per.(counted.values.sum { |p| p["gc_ms"].to_f }),
        rss_mb: counted.values.sum { |p| p["rss_kb"] }.fdiv([counted.size, 1].max) / 1024,
        workers: counted.size }
    end
  end

  # Minor page faults of the process so far (/proc/PID/stat's minflt).
  def minflt(pid)
    fields = Memkit::ProcFS.stat_fields(pid) or raise "worker #{pid} is gone"
    Integer(fields.fetch(7))
  end

  def report(rows)
    puts "Ruby #{RUBY_VERSION}; medians over repeats; ratios against none"
    puts format("%-8s %-7s %-13s %8s %11s %11s %10s %7s %6s %6s %7s",
                "server", "shape", "mode", "req/s", "faults/req", "cpu_ms/req", "gc_ms/req", "rss_MB",
                "rps_x", "cpu_x", "rss_x")
    rows.group_by { |r| [r[:server], r[:shape]] }.each do |(server, shape), cells|
      by_mode = cells.group_by { |r| r[:mode] }.transform_values do |rs|
        %i[rps faults_per_req cpu_ms_per_req gc_ms_per_req rss_mb].to_h do |k|
          [k, OobgcMatrix.median(rs.map { |r| r[k] })]
        end
      end
      none = by_mode.fetch("none")
      MODES.each_key do |mode|
        m = by_mode[mode] or next
        puts format("%-8s %-7s %-13s %8.1f %11.0f %11.1f %10.1f %7.1f %6.2f %6.2f %7.2f", server, shape, mode,
                    m[:rps], m[:faults_per_req], m[:cpu_ms_per_req], m[:gc_ms_per_req], m[:rss_mb],
                    m[:rps] / none[:rps], m[:cpu_ms_per_req] / none[:cpu_ms_per_req], m[:rss_mb] / none[:rss_mb])
      end
    end
  end
end

OobgcFaults.run(ARGV) if $PROGRAM_NAME == __FILE__
