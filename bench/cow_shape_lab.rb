# frozen_string_literal: true

# In-process: what a forked child's memory does while it serves requests,
# depending on how the parent was prepared. Boots the app shape
# (lib/memkit/bench/cow_app.rb, scale 1) or, with --rails, the Rails bench app
# (bench/rails, run with its Gemfile), prepares as MODE says, forks one child
# that serves N requests in-process, printing every STEP requests its GC
# counters and malloc arena (mallinfo2), then runs a full GC; the parent
# prints the child's USS.
#
#   bundle exec ruby bench/cow_shape_lab.rb hook 2000
#   cd bench/rails && BUNDLE_GEMFILE=$PWD/Gemfile bundle exec ruby ../cow_shape_lab.rb --rails memkit+fill 300
#
# MODE: hook (Memkit.warmup), fill (fill: true), app (warm-up requests, fill: :auto),
# process_warmup, none (COW_APP_SCALE=X for another scale); with --rails the modes of CowRails.in_process (memkit, memkit+fill, plain).
$LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
require "memkit"

rails = ARGV.delete("--rails")
mode = ARGV.fetch(0, "hook")
requests = Integer(ARGV.fetch(1, rails ? "300" : "2000"))
step = Integer(ENV.fetch("STEP", rails ? "50" : "100"))

if rails
  require_relative "cow_rails"
  app, = CowRails.in_process(mode)
  env_for = ->(i) { Memkit::Warmup::App.env(CowRails.path(i * 4)) }
else
  require "memkit/bench/cow_app"
  app = Memkit::Bench::CowApp.boot(scale: Float(ENV.fetch("COW_APP_SCALE", "1")))
  case mode
  when "hook" then Memkit.warmup
  when "fill" then Memkit.warmup(fill: true)
  when "app" then Memkit.warmup(app: app, requests: Array.new(8) { "/" })
  when "process_warmup" then Process.warmup
  when "none" then nil
  else abort "unknown mode #{mode}"
  end
  env_for = ->(_i) { Memkit::Warmup::App.env("/") }
end

mb = ->(bytes) { format("%.1f", bytes / 1e6) }
line = lambda do |label|
  s = GC.stat
  m = Memkit::Libc.mallinfo2
  format("%s gc %d major %d pages %d free_slots %d malloc_limit %s arena %s in_use %s", label, s[:count],
         s[:major_gc_count], s[:heap_allocated_pages], s[:heap_free_slots], mb.(s[:malloc_increase_bytes_limit]),
         mb.(m.arena), mb.(m.uordblks))
end
puts line.("parent:")
puts "parent report: #{Memkit::Warmup.last_report&.to_h&.slice(:steps, :slots_filled, :gc_forecast).inspect}"
$stdout.flush

ready_r, ready_w = IO.pipe
pid = fork do
  ready_r.close
  requests.times do |i|
    _status, _headers, body = app.call(env_for.(i))
    body.each { |_| nil }
    body.close if body.respond_to?(:close)
    puts line.(format("  req %4d", i)) if (i % step).zero?
  end
  GC.start(full_mark: true, immediate_sweep: true)
  puts line.("child after a full GC:")
  $stdout.flush
  ready_w.write("r")
  sleep
end
ready_w.close
ready_r.read(1)
puts format("%s %s: child uss %s MB (ruby %s)", rails ? "rails" : "app shape", mode, mb.(Memkit::Memory.read(pid).uss),
            RUBY_VERSION)
Process.kill(:KILL, pid)
Process.wait(pid)
