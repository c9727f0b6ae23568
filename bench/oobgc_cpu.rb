# frozen_string_literal: true

# Out-of-band GC measured in CPU time, in one process, without a server: the
# same GC-heavy app as bench/oobgc.rb (bench/oobgc_app.rb), each mode in a
# fresh child process, rounds interleaved.
#
#   bundle exec ruby -Ilib bench/oobgc_cpu.rb [--requests 800] [--rounds 3] [--warmup 100]
#
# Why CPU time: on a shared machine, wall-clock latency mostly measures other
# processes. CLOCK_PROCESS_CPUTIME_ID counts only this process's work, GC
# included, so the tail of the per-request time is the GC that ran inside the
# request. "cpu/req" adds the out-of-band GC time: its inverse is the most
# requests per CPU second, i.e. saturated throughput.
#
# Modes:
#   none           no out-of-band GC
#   every5_major   GC.start after every 5th response: Unicorn::OobGC's policy
#                  (Unicorn::OobGC itself only runs inside Unicorn)
#   memkit         Memkit::OobGC, its after-reply hook called as Unicorn does
require "optparse"
require "json"
require "rbconfig"

module OobgcCpuBench
  MODES = %w[none every5_major memkit].freeze

  module_function

  def run(argv)
    opts = { requests: 800, rounds: 3, warmup: 100 }
    OptionParser.new do |o|
      o.on("--headroom X", Float, "Memkit::OobGC headroom:") { |v| ENV["OOBGC_HEADROOM"] = v.to_s }
      o.on("--requests N", Integer) { |v| opts[:requests] = v }
      o.on("--rounds N", Integer) { |v| opts[:rounds] = v }
      o.on("--warmup N", Integer, "requests before measuring, from a cold heap") { |v| opts[:warmup] = v }
    end.parse!(argv)
    puts "oobgc cpu bench: #{RUBY_DESCRIPTION}, #{opts[:warmup]} requests of warm-up, #{opts[:requests]} measured, " \
         "#{opts[:rounds]} rounds, medians"
    results = Hash.new { |h, k| h[k] = [] }
    opts[:rounds].times { MODES.each { |mode| results[mode] << child(mode, opts[:requests], opts[:warmup]) } }
    med = results.transform_values { |runs| runs.first.keys.to_h { |k| [k, median(runs.map { |r| r[k] })] } }
    puts format("%-13s %8s %8s %8s %9s %7s %7s %7s %10s", "mode", "p50_ms", "p99_ms", "max_ms", "cpu/req", "minor", "major",
                "inside", "heap_slots")
    med.each do |mode, r|
      puts format("%-13s %8.2f %8.2f %8.2f %9.2f %7d %7d %7d %10d", mode, r["p50"], r["p99"], r["max"], r["cpu_per_req"],
                  r["minor"], r["major"], r["inside"], r["heap"])
    end
    mk = med["memkit"]
    puts
    %w[none every5_major].each do |other|
      o = med[other]
      puts format("memkit vs %-12s p99 %.2fx, max %.2fx, throughput (requests per CPU second) %.2fx",
                  other, mk["p99"] / o["p99"], mk["max"] / o["max"], o["cpu_per_req"] / mk["cpu_per_req"])
    end
    total = mk["minor"] + mk["major"]
    puts format("memkit GC runs outside requests: %.1f%% of %d", 100.0 * (total - mk["inside"]) / total, total)
  end

  def median(values)
    values.sort[values.size / 2]
  end

  def child(mode, requests, warmup)
    reader, writer = IO.pipe
    pid = fork do
      reader.close
      writer.write(JSON.generate(measure(mode, requests, warmup)))
      writer.close
      exit!(0)
    end
    writer.close
    result = JSON.parse(reader.read)
    Process.wait(pid)
    result
  end

  def measure(mode, requests, warmup)
    require_relative "oobgc_app"
    require "memkit"
    app = ->(_env) { [200, {}, [OobgcBench.render]] }
    app = Memkit::OobGC.new(app, **(ENV["OOBGC_HEADROOM"] ? { headroom: Float(ENV["OOBGC_HEADROOM"]) } : {})) if mode == "memkit"
    GC.start
    # warm-up, as a booted server would have served some requests
    warmup.times { |i| serve(app, mode, i + 1) }
    minor = GC.stat(:minor_gc_count)
    major = GC.stat(:major_gc_count)
    inside = 0
    times = []
    started = cpu
    requests.times do |i|
      count = GC.count
      t = cpu
      hooks = serve(app, mode, i + 1) { inside += GC.count - count; times << cpu - t }
      hooks.each(&:call)
    end
    total = cpu - started
    times.sort!
    { "p50" => times[times.size / 2] * 1000, "p99" => times[(times.size * 0.99).floor] * 1000, "max" => times[-1] * 1000,
      "cpu_per_req" => total / requests * 1000, "minor" => GC.stat(:minor_gc_count) - minor,
      "major" => GC.stat(:major_gc_count) - major, "inside" => inside, "heap" => GC.stat(:heap_available_slots) }
  end

  # Calls the app; yields once the response is complete; returns the
  # after-reply hooks still to run.
  def serve(app, mode, n)
    env = { "rack.after_reply" => [] }
    _, _, body = app.call(env)
    body.each { |_| nil }
    yield if block_given?
    env["rack.after_reply"] << -> { GC.start } if mode == "every5_major" && (n % 5).zero?
    env["rack.after_reply"].tap { |hooks| hooks.each(&:call) unless block_given? }
  end

  def cpu = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)
end

OobgcCpuBench.run(ARGV) if $PROGRAM_NAME == __FILE__
