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
          o.on("--estimate", "use smaps Shared/rss even where pagemap frame numbers are readable") { options[:estimate] = true }
          watch_option(o)
        end
        pid = pid_argument(argv)
        repeat { report(pid) }
      end

      private

      def report(pid)
        cow = Memkit::Cow.read(pid, exact: options[:estimate] ? false : :auto)
        return print_json(cow.to_h) if options[:json]

        rows = cow.workers.map do |w|
          [w.pid, human(w.rss), human(w.shared_with_master), format("%.1f%%", w.shared_pct), human(w.private_dirty),
           CLI.printable(Memkit::Tree.command(w.pid))[0, 48]]
        rescue NoSuchProcess, PermissionDenied
          nil
        end.compact
        out.puts "master #{pid}: rss #{human(cow.master_rss)}, private_dirty #{human(cow.master_private_dirty)}"
        if rows.empty?
          out.puts "no workers: pid #{pid} has no child processes"
        else
          out.puts CLI.table(%w[worker rss shared_with_master shared% private_dirty command], rows, left: [5])
        end
        out.puts(cow.method == :pagemap ? "exact: pages mapping the same physical frame as the master (/proc/PID/pagemap)." :
                 "estimate: worker's smaps Shared over the master's rss (pagemap frame numbers need root).")
        nil
      end
    end
  end
end
