# frozen_string_literal: true

# Which kind of work in a forked child un-shares the master's pages: boots
# bench/cow_app.rb, prepares the heap with Memkit.warmup(**opts), then for
# each operation forks one child that runs it 2000 times plus a full GC, and
# measures that child's sharing from a separate process (pagemap frames).
#
#   bundle exec ruby bench/cow_ops.rb [plain|nofill|warmup] [op,op...]
$LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
require "memkit"
require "rbconfig"
require_relative "cow_app"

mode = ARGV[0] || "warmup"
CowApp.boot
# COW_WARM_REQUESTS=N: serve N requests in the master first, so call sites
# and caches are filled before fork (what a real app's warmup requests do).
Integer(ENV.fetch("COW_WARM_REQUESTS", "0")).times { CowApp.call({ "PATH_INFO" => "/" }) }
case mode
when "plain" then nil
when "warmup" then Memkit.warmup
when "nofill" then Memkit.warmup(fill: false)
else abort "mode: plain, nofill or warmup"
end

ops = {
  gc_only: ->(_rng) {},
  lookups: ->(rng) { r = CowApp.by_id[rng.rand(CowApp.records.size)]; CowApp.by_category[r["category"]].sample(5, random: rng) },
  string_checks: ->(rng) { rs = Array.new(5) { CowApp.by_id[rng.rand(CowApp.records.size)] }; rs.count { |r| r["name"].include?("item") && r["description"].match?(/[aeiou]{2}/) } },
  erb_render: ->(rng) { r = CowApp.by_id[rng.rand(CowApp.records.size)]; CowApp::Templates.instance_method(:"render_#{rng.rand(300)}").bind_call(Object.new, r) },
  json_generate: ->(rng) { rs = Array.new(5) { CowApp.by_id[rng.rand(CowApp.records.size)] }; JSON.generate(rs.map { |r| r.slice("id", "name", "price") }) },
  first_calls: ->(rng) { CowApp::Templates.public_send(:"helper_#{rng.rand(3000)}", 1) },
  garbage_3000_strings: ->(_rng) { Array.new(3000) { "x" * 30 } },
  full_request: ->(_rng) { CowApp.call({ "PATH_INFO" => "/" }) }
}
ops.select! { |name, _| ARGV[1].nil? || ARGV[1].split(",").include?(name.to_s) }

puts "cow_ops: ruby #{RUBY_VERSION}, prepared with: #{mode}, warm requests #{ENV.fetch('COW_WARM_REQUESTS', '0')}, master rss #{Memkit::Units.human(Memkit.rss)}"
ops.each do |name, op|
  r, w = IO.pipe
  pid = fork do
    r.close
    rng = Random.new(7)
    2000.times { op.call(rng) }
    GC.start(full_mark: true, immediate_sweep: true)
    w.write("r")
    w.close
    sleep
  end
  w.close
  r.read(1)
  code = "c = Memkit::Cow.read(#{Process.pid}, [#{pid}]).workers[0]; " \
         "puts format('%-22s shared %5.1f%%  private_dirty %6.1f MiB', '#{name}', c.shared_pct, c.private_dirty / 1048576.0)"
  system(RbConfig.ruby, "-I", File.expand_path("../lib", __dir__), "-rmemkit", "-rmemkit/cow", "-e", code)
  Process.kill(:KILL, pid)
  Process.wait(pid)
end
