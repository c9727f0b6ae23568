# frozen_string_literal: true

require_relative "../cow"

module Memkit
  class CLI
    # memkit cow PID: each worker's sharing with its master, to watch
    # copy-on-write decay on a live server.
    class Cow < Command
      def call(argv)
        parse(argv, "MASTER_PID [--json] [--estimate] [--watch SECONDS]") do |o|
          json_option(o)
          o.on("--estimate", "use smaps Shared/rss even where pagemap frame numbers are readable") do
            options[:estimate] = true
          end
          watch_option(o)
        end
        pid = pid_argument(argv)
        repeat { report(pid) }
      end

      private

      def report(pid)
        cow = Memkit::Cow.read(pid, exact: options[:estimate] ? false : :auto)
        return print_json(cow.to_h) if options[:json]

        if cow.workers.empty?
          out.puts "master #{pid}: pss #{human(cow.master_pss)}, rss #{human(cow.master_rss)}"
          out.puts "no workers: pid #{pid} has no child processes"
          return nil
        end
        uss = cow.workers.map(&:uss)
        out.puts "tree #{pid}: pss #{human(cow.tree_pss)} (master #{human(cow.master_pss)} + #{cow.workers.size} " \
                 "workers #{human(cow.workers.sum(&:pss))}); " \
                 "worker uss mean #{human(uss.sum / uss.size)}, max #{human(uss.max)}"
        rows = cow.workers.map do |w|
          [w.pid, human(w.uss), human(w.pss), human(w.private_dirty), format("%.1f%%", w.shared_pct),
           human(w.shared_with_master), human(w.rss), command(w.pid)]
        end
        out.puts CLI.table(%w[worker uss pss private_dirty shared% shared_with_master rss command], rows, left: [7])
        out.puts "master #{pid}: rss #{human(cow.master_rss)}, private_dirty #{human(cow.master_private_dirty)} " \
                 "(shared% is of this rss: a bigger master can raise it while the tree grows)"
        out.puts(cow.method == :pagemap ? "exact: pages mapping the same physical frame as the master (/proc/PID/pagemap)." :
                 "estimate: worker's smaps Shared over the master's rss (pagemap frame numbers need root).")
        nil
      end

      # Escaped (CLI.printable): a worker's command line is whatever it set.
      def command(pid)
        CLI.printable(Memkit::Tree.command(pid))[0, 48]
      rescue NoSuchProcess, PermissionDenied
        "(exited)"
      end
    end
  end
end
