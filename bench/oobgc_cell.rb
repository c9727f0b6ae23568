# frozen_string_literal: true

# One cell of bench/oobgc_matrix.rb, with a file of your own required
# right after memkit in the app (a patch to try, a probe to attach):
#
#   flock /tmp/memkit-bench.lock bundle exec ruby -Ilib bench/oobgc_cell.rb [--pin] MODE SHAPE SERVER [PACE_MS] [FILE]
#
# MODE: none, memkit, memkit_plugin; SHAPE: a key of OobgcMatrix::SHAPES;
# SERVER: unicorn, puma, puma_close; PACE_MS: 0 (saturated, the default) or
# each connection's pause between requests. Prints wrk's requests per
# second, p50 and p99 latency and, per worker, what its probe counted after the warm-up.
# --pin: servers on CPU 0 and wrk on CPU 1, as bench/oobgc_p99.rb --pin.
require_relative "oobgc_matrix"

OobgcMatrix.pin! if ARGV.delete("--pin")
mode, shape, server, pace, file = ARGV
abort "usage: #{$PROGRAM_NAME} [--pin] MODE SHAPE SERVER [PACE_MS] [FILE]" unless mode && shape && server
kind, close = OobgcMatrix::SERVERS.fetch(server)
Dir.mktmpdir("memkit-oobgc-cell") do |dir|
  extra = mode == "memkit_plugin" ? "plugin :memkit" : ""
  source = OobgcMatrix.app_source(mode, dir)
  source = source.sub('require "memkit"', "require \"memkit\"\nrequire #{File.expand_path(file).inspect}") if file
  out = OobgcMatrix.serve(kind, shape, source, dir, { connections: 4 }, close, extra: extra) do |url|
    OobgcMatrix.wrk(url, 8, { connections: 4 }, pace.to_i, close, nil)
  end
  puts out[/Requests\/sec:.*/], "p50 #{out[/^\s+50%\s+(\S+)/, 1]} p99 #{out[/^\s+99%\s+(\S+)/, 1]}"
  OobgcMatrix.probes(dir).each do |p|
    n = [p["requests"], 1].max
    grown = p["oob"] && format(" heap growths %d (%d counted), %d MB grown", p["oob"]["grow_runs"],
                               p["oob"]["grow_runs_counted"], p["oob"]["heap_grown_bytes"] >> 20)
    puts format("  worker: req %d cpu/req %.2f ms gc_ms/req %.2f rss %d MB gc %d major %d inside %d (major %d)%s",
                p["requests"], p["cpu_ms"] / n, p["gc_ms"].to_f / n, p["rss_kb"] / 1024, p["gc_total"], p["gc_major"],
                p["gc_inside"], p["gc_inside_major"], grown)
  end
end
