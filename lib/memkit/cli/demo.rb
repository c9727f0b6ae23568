# frozen_string_literal: true

require_relative "../demo"
require_relative "tree"

module Memkit
  class CLI
    # memkit demo: a real forking server, measured the way memkit measures.
    class Demo < Command
      def call(argv)
        parse(argv, "[--server unicorn|puma] [--workers N] [--requests N]") do |o|
          o.on("--server NAME", %w[unicorn puma], "server to boot (default: unicorn)") { |s| options[:server] = s }
          o.on("--workers N", Integer, "worker processes (default: 4)") { |n| options[:workers] = n }
          o.on("--requests N", Integer, "requests to send (default: 400)") { |n| options[:requests] = n }
        end
        raise UsageError, "unexpected argument #{argv.first.inspect}" unless argv.empty?
        raise UsageError, "--workers must be 1 or more" if options.fetch(:workers, 1) < 1

        Memkit::Demo.new(**options, out: out).run do |pid|
          tree = Memkit.tree(pid)
          out.puts Tree.render(tree), ""
          out.puts "Summing RSS, as ps-based tools do, says #{human(tree.total_rss)}; " \
                   "the server really uses #{human(tree.total_pss)} (PSS)."
          out.puts "Killing one worker would free about #{human(tree.nodes.last.memory.uss)} (its USS)."
        end
      end
    end
  end
end
