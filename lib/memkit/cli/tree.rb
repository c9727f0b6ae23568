# frozen_string_literal: true

module Memkit
  class CLI
    # memkit tree PID: the whole server (master and workers) and its true total.
    class Tree < Command
      SORTS = %w[pss uss rss].freeze

      def call(argv)
        parse(argv, "PID [--json] [--watch SECONDS] [--sort pss|uss|rss]") do |o|
          json_option(o)
          watch_option(o)
          o.on("--sort KEY", SORTS, "order workers by pss, uss or rss (default: tree order)") { |k| options[:sort] = k }
        end
        pid = pid_argument(argv)
        repeat { report(pid) }
      end

      private

      def report(pid)
        tree = Memkit.tree(pid)
        tree = tree.sort_by(options[:sort]) if options[:sort]
        container = Tree.container(tree.pid)
        return print_json(tree.to_h.merge(container: container&.to_h)) if options[:json]

        out.puts Tree.render(tree, container)
      end

      # The memory cgroup the tree's root runs in (its container), or nil
      # where there is none to read.
      def self.container(pid)
        Cgroup.read(pid)
      rescue Error
        nil
      end

      # One line: the tree against its container's limit.
      def self.container_note(tree, reading)
        human = Units.method(:human)
        where = "cgroup v#{reading.version} #{CLI.printable(reading.path)}"
        unless reading.limited?
          return "container: no memory limit (#{where}); usage #{human.(reading.usage)} with page cache."
        end

        format("container: the tree's pss is %.0f%% of the %s limit (%s); usage %s with page cache.",
               100.0 * tree.total_pss / reading.limit, human.(reading.limit), where, human.(reading.usage))
      end

      def self.render(tree, container = nil)
        human = Units.method(:human)
        rows = tree.nodes.map do |n|
          m = n.memory
          [n.pid, n.ppid, "#{'  ' * n.depth}#{CLI.printable(n.command)[0, 48]}",
           *[m.rss, m.pss, m.uss, m.shared, m.private_dirty, m.swap].map(&human),
           format("%.1f%%", n.shared_pct)]
        end
        rows << ["total", "", "#{tree.nodes.size} processes", human.(tree.total_rss), human.(tree.total_pss),
                 human.(tree.total_uss), "", "", human.(tree.total_swap), ""]
        notes = ["rss summed over processes counts shared pages once per process; pss is the real total.",
                 "shared% is the part of each process's own rss it shares with other processes."]
        kernel = tree.nodes.select(&:kernel_thread)
        if kernel.any?
          who = kernel.first(3).map { |n| "#{n.pid} #{CLI.printable(n.command)}" }.join(", ")
          more = kernel.size > 3 ? " and #{kernel.size - 3} more" : ""
          notes << "kernel threads have no user memory (all figures 0): #{who}#{more}."
        end
        notes += tree.skipped.map { |pid, why| "skipped pid #{pid}: #{why}" }
        notes << container_note(tree, container) if container
        headers = %w[pid ppid command rss pss uss shared private_dirty swap shared%]
        [CLI.table(headers, rows, left: [2]), *notes].join("\n")
      end
    end
  end
end
