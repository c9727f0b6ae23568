# frozen_string_literal: true

module Memkit
  class CLI
    # memkit stat PID: one process's memory.
    class Stat < Command
      def call(argv)
        parse(argv, "PID [--json]") { |o| json_option(o) }
        pid = pid_argument(argv)
        memory = Memkit.memory(pid)
        kernel = memory.equal?(Memory::NONE) && ProcFS.kernel_thread?(pid)
        return print_json({ pid: pid, **memory.to_h, kernel_thread: kernel }) if options[:json]

        rows = memory.to_h.map { |field, bytes| [field, human(bytes), bytes] }
        title = "pid #{pid}"
        title += " #{CLI.printable(Memkit::Tree.command(pid))}: a kernel thread, no user memory" if kernel
        out.puts title, CLI.table(%w[field size bytes], rows, left: [0])
      end
    end
  end
end
