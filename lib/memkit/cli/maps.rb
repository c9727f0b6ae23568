# frozen_string_literal: true

module Memkit
  class CLI
    # memkit maps PID: where a process's memory lives, by kind of mapping.
    class Maps < Command
      def call(argv)
        parse(argv, "PID [--json]") { |o| json_option(o) }
        pid = pid_argument(argv)
        groups = begin
          Memkit.mappings(pid).groups
        rescue NoSuchProcess
          raise unless ProcFS.kernel_thread?(pid)

          # A kernel thread has no user address space: no mappings to group.
          return print_json({ pid: pid, kinds: {}, kernel_thread: true }) if options[:json]

          return out.puts("pid #{pid} #{CLI.printable(Memkit::Tree.command(pid))}: a kernel thread, no user memory")
        end
        return print_json({ pid: pid, kinds: groups.transform_values { |g| g.to_h.except(:kind) } }) if options[:json]

        rows = groups.values.reject { |g| g.count.zero? }.sort_by { |g| -g.rss }.map do |g|
          [g.kind, g.count, human(g.size), human(g.rss), human(g.pss), human(g.private_dirty), human(g.swap),
           Mappings::KINDS.fetch(g.kind)]
        end
        out.puts "pid #{pid}", CLI.table(%w[kind maps size rss pss private_dirty swap what], rows, left: [0, 7])
      end
    end
  end
end
