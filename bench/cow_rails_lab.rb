# frozen_string_literal: true

# A quick lab for the Rails app's copy-on-write, without a server or sockets:
# boots bench/rails in this process, prepares as MODE says, forks 4 children
# that each call the app in-process for N requests (bench/cow_rails.rb's mix)
# and run a full GC, then reads the tree's total PSS and each child's USS.
# For choosing steps quickly; bench/cow_rails.rb is the measurement on real
# servers.
#
#   BUNDLE_GEMFILE=bench/rails/Gemfile bundle exec ruby bench/cow_rails_lab.rb MODE [REQUESTS]
#   MODE: plain | nakayoshi | process_warmup | heap | memkit | memkit+fill | heap+fill
require_relative "cow_rails"
mode = ARGV.fetch(0)
requests = Integer(ARGV.fetch(1, "500"))
# LAB_WARM=N: N requests of bench/cow_rails.rb's mix (from far in its sequence) instead of the app's list.
warm = (Array.new(Integer(ENV["LAB_WARM"])) { |i| CowRails.path(1_000_003 + i) } if ENV["LAB_WARM"])
app, = CowRails.in_process(mode, warm: warm)
# LAB_CONNECT=1: open the database connection and load one product first (to see what that alone costs).
connect = (-> { Product.first.reviews.to_a } if ENV["LAB_CONNECT"])
CowRails.in_process_children(app, requests, before: connect) do |pids|
  tree = Memkit::Tree.read(Process.pid)
  master = tree.nodes.find { |n| n.pid == Process.pid }.memory
  uss = tree.nodes.reject { |n| n.pid == Process.pid }.map { |n| n.memory.uss }
  puts format("%-16s %5d req: tree %6.1f MB  master pss %5.1f rss %5.1f  child uss mean %5.1f max %5.1f",
              mode, requests, tree.total_pss / 1e6, master.pss / 1e6, master.rss / 1e6, uss.sum / 4e6, uss.max / 1e6)
  system(RbConfig.ruby, File.expand_path("../exe/memkit", __dir__), "maps", pids.first.to_s) if ENV["LAB_MAPS"]
end
