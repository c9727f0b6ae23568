# frozen_string_literal: true

module Memkit
  class CLI
    # memkit maps PID: where a process's memory lives, by kind of mapping.
    class Maps < Command
      def call(argv)
        parse(argv, "PID [--json]") { |o| json_option(o) }
        pid = pid_argument(argv)
        groups = Memkit.mappings(pid).groups
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
