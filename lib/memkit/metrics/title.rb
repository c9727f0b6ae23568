# frozen_string_literal: true

module Memkit
  class Metrics
    # What a server's process title says about the process: Unicorn, Puma and
    # Pitchfork each name their workers with the index the master gave them
    # (the index a replacement inherits), and Pitchfork names its molds.
    #
    #   unicorn worker[2] -c unicorn.rb config.ru      -> [:worker, 2]
    #   puma: cluster worker 1: 4242 [app]              -> [:worker, 1]
    #   pitchfork (gen:0) worker[0] - ready             -> [:worker, 0]
    #   pitchfork (gen:1) mold - init                   -> [:mold, nil]
    #
    # Titles are what the server chose to show, read from /proc/PID/cmdline:
    # an explicit hook (Memkit::Metrics.worker_booted) takes precedence.
    module Title
      WORKER = [/\bworker\[(\d+)\]/, /\Apuma: cluster worker (\d+):/].freeze
      MOLD = /\A\S+ \(gen:\d+\) mold\b/
      # Pitchfork forks a worker or mold through a short-lived middle process
      # so that it ends up a child of the monitor: a worker's parent at boot.
      PASSING = /\A<pitchfork fork_sibling\(/

      module_function

      # [role, index]: [:worker, Integer], [:mold, nil], or [nil, nil] when the
      # title names neither.
      def parse(title)
        title = title.to_s.b
        WORKER.each do |pattern|
          m = pattern.match(title) and return [:worker, Integer(m[1], 10)]
        end
        title.match?(MOLD) ? [:mold, nil] : [nil, nil]
      end

      # The server's master for a process: the process itself unless its
      # title names it a worker or mold, else the nearest ancestor whose title
      # does not (Puma's fork_worker forks workers from worker 0; Pitchfork
      # forks them from a mold, through a passing middle process). It stops there, so a wrapper above the master
      # (foreman, a shell, a Ruby script that spawns the server) never becomes
      # the root.
      def master(pid, root: "/proc")
        seen = {}
        loop do
          title = Tree.command(pid, root: root)
          role, = parse(title)
          return pid unless role || title.b.match?(PASSING)

          seen[pid] = true
          parent = Status.read(pid, root: root).ppid
          # An orphaned worker (its master gone, adopted by init) is its own root.
          return pid if parent <= 1 || seen[parent]

          pid = parent
        end
      end
    end
  end
end
