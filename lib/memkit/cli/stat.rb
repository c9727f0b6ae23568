# frozen_string_literal: true

module Memkit
  class CLI
    # memkit stat PID: one process's memory.
    class Stat < Command
      def call(argv)
        parse(argv, "PID [--json]") { |o| json_option(o) }
        pid = pid_argument(argv)
        memory = Memkit.memory(pid)
        return print_json({ pid: pid, **memory.to_h }) if options[:json]

        rows = memory.to_h.map { |field, bytes| [field, human(bytes), bytes] }
        out.puts "pid #{pid}", CLI.table(%w[field size bytes], rows, left: [0])
      end
    end
  end
end
