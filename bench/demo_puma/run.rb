# Diagnostic (not a benchmark): boots Puma (4 workers, `threads 1, 4`, plugin :memkit) on a config.ru
# (RU=path, default bench/demo_puma/demo.ru: the demo app loading memkit with `require "memkit"`, so RUBYLIB
# can point at another copy of lib), sends 100 + 600 requests on new connections, and prints the GC runs
# between / inside requests from the metrics scrape, then the workers' stderr lines the diag config writes.
#   script/ruby33 env RUBYLIB=/memkit/tmp/x/lib RU=bench/demo_puma/diag.ru HOOK=1 bundle exec ruby bench/demo_puma/run.rb
# T="1, 1" threads; NOPLUGIN=1; QR=1 (queue_requests false); HOOK=1 logs the master's GC state at fork; L=lines.
# Results in docs/BENCHMARKS.md ("memkit demo --server puma on Ruby 3.3 and 3.4").
require "net/http"; require "tmpdir"
threads = ENV.fetch("T", "1, 4"); port = 9393 + rand(500)
dir = Dir.mktmpdir
cfg = File.join(dir, "puma.rb")
File.write(cfg, <<~R)
  workers 4
  threads #{threads}
  bind "tcp://127.0.0.1:#{port}"
  preload_app!
  #{ENV["NOPLUGIN"] ? "" : "plugin :memkit"}
  #{ENV["QR"] ? "queue_requests false" : ""}
  #{ENV["HOOK"] ? 'before_fork { i = GC.latest_gc_info; s = GC.stat; $stderr.puts "FORKSTATE pid=#{$$} count=#{GC.count} minor=#{s[:minor_gc_count]} major=#{s[:major_gc_count]} last=#{i.slice(:major_by, :gc_by, :need_major_by, :state)} oldmalloc=#{s[:oldmalloc_increase_bytes]}/#{s[:oldmalloc_increase_bytes_limit]} old=#{s[:old_objects]}/#{s[:old_objects_limit]}" }' : ""}
  rackup #{File.expand_path(ENV.fetch("RU", File.expand_path("demo.ru", __dir__))).inspect}
R
pid = spawn(Gem.bin_path("puma", "puma"), "-C", cfg, out: File::NULL, err: File.join(dir, "err"))
def get(port, path) = Net::HTTP.get_response(URI("http://127.0.0.1:#{port}#{path}"))
60.times { (get(port, "/products/1"); break) rescue sleep 0.5 }
sleep 2
def scrape(port)
  t = get(port, "/metrics").body; h = Hash.new(0)
  t.scan(/^memkit_oobgc_(runs|inside_request_runs)_total\{[^}]*worker="(\d+)"[^}]*\} (\S+)/) { |n, w, v| h[n] += v.to_f }
  h
end
100.times { |i| get(port, "/products/#{i * 43}") }
sleep 1.1; a = scrape(port)
600.times { |i| get(port, "/products/#{i * 41}") }
sleep 1.1; 16.times { |i| get(port, "/products/#{i}") }; sleep 1.1
b = scrape(port)
puts "threads=#{threads} between=#{b["runs"] - a["runs"]} inside=#{b["inside_request_runs"] - a["inside_request_runs"]}"
Process.kill("TERM", pid); Process.wait(pid)
puts File.read(File.join(dir, "err")).lines.grep(/LIGHT|GCSTART|GCCOMPACT|PWARMUP|GCLOG|DIAG|FORKSTATE|memkit|COL|rror/).last(ENV.fetch("L","40").to_i)
