# frozen_string_literal: true

module Memkit
  class CLI
    # memkit smaps PID: the summary memstat prints, plus what it leaves to
    # the reader: how much of the process is shared.
    class Smaps < Command
      def call(argv)
        parse(argv, "PID [--json]") { |o| json_option(o) }
        pid = pid_argument(argv)
        memory = Memkit.memory(pid)
        size = Statm.read(pid).size
        shared_pct = memory.rss.zero? ? 0.0 : (100.0 * memory.shared / memory.rss).round(1)
        summary = { size: size, rss: memory.rss, pss: memory.pss, shared_clean: memory.shared_clean,
                    shared_dirty: memory.shared_dirty, private_clean: memory.private_clean,
                    private_dirty: memory.private_dirty, swap: memory.swap }
        return print_json({ pid: pid, **summary, uss: memory.uss, shared_pct: shared_pct }) if options[:json]

        out.puts "Process:      #{pid}", "Command line: #{CLI.printable(Memkit::Tree.command(pid))}", "Memory summary:"
        summary.each do |field, bytes|
          out.puts format("  %-14s %14s kB", field, (bytes / 1024).to_s.gsub(/\B(?=(\d{3})+\z)/, ","))
        end
        out.puts "#{human(memory.shared)} of #{human(memory.rss)} resident is shared (#{shared_pct}%)."
      end
    end
  end
end
