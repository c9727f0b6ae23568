# frozen_string_literal: true

module Memkit
  # A process and all its descendants, each with its memory.
  #
  # total_pss is the real footprint of a forked server; total_rss is what
  # tools that add up RSS report, counting shared pages once per worker.
  #
  # shared_pct is the part of each process's own rss that it shares with any
  # other process (Shared_Clean + Shared_Dirty over Rss, at most 100%). It is
  # not a share of the root's memory: a worker also shares libraries with
  # unrelated processes, and pages with its siblings that the master has
  # since dropped, so its shared bytes can exceed the master's rss.
  class Tree
    Node = Struct.new(:pid, :ppid, :depth, :command, :memory, :kernel_thread, keyword_init: true) do
      def shared_pct = memory.rss.zero? ? 0.0 : 100.0 * memory.shared / memory.rss

      def to_h
        { pid: pid, ppid: ppid, command: command, **memory.to_h, shared_pct: shared_pct.round(1),
          kernel_thread: kernel_thread ? true : false }
      end
    end

    attr_reader :root, :nodes, :skipped

    def self.read(pid, root: "/proc")
      pid = ProcFS.pid!(pid)
      parents = ProcFS.parents(root: root)
      raise NoSuchProcess, "no such process: pid #{pid}" unless parents.key?(pid)

      children = ProcFS.children(parents: parents)
      nodes = []
      skipped = {}
      walk(pid, children, 0) do |child, depth|
        nodes << read_node(child, parents[child], depth, root)
      rescue NoSuchProcess, PermissionDenied => e
        # A worker that exits while we walk is simply no longer part of the tree;
        # one we may not read is listed as skipped rather than failing the report.
        raise if child == pid

        skipped[child] = e.message if e.is_a?(PermissionDenied)
      end
      new(nodes, skipped: skipped)
    end

    # The command line, or "[comm]" for kernel threads and zombies, as the
    # process set it: it may hold newlines, tabs and escape sequences, which
    # the CLI makes visible before printing (CLI.printable).
    def self.command(pid, root: "/proc")
      cmdline = File.binread("#{root}/#{pid}/cmdline").tr("\0", " ").strip
      return cmdline.force_encoding(Encoding::UTF_8).scrub unless cmdline.empty?

      "[#{File.binread("#{root}/#{pid}/comm").chomp.force_encoding(Encoding::UTF_8).scrub}]"
    rescue SystemCallError => e
      raise ProcFS.translate(e, pid, "cmdline", root)
    end

    def initialize(nodes, skipped: {})
      @nodes = nodes
      @skipped = skipped
      @root = nodes.first
      freeze
    end

    def pid = root.pid
    def total_pss = sum(:pss)
    def total_uss = sum(:uss)
    def total_rss = sum(:rss)
    def total_swap = sum(:swap)

    def sort_by(key)
      rest = nodes.drop(1).sort_by { |n| -n.memory.public_send(key) }
      Tree.new([root, *rest], skipped: skipped)
    end

    def to_h
      { root: root.pid, processes: nodes.map(&:to_h),
        total: { rss: total_rss, pss: total_pss, uss: total_uss, swap: total_swap } }
    end

    private

    def sum(field) = nodes.sum { |n| n.memory.public_send(field) }

    class << self
      private

      def walk(pid, children, depth, &block)
        yield pid, depth
        children.fetch(pid, []).each { |child| walk(child, children, depth + 1, &block) }
      end

      def read_node(pid, ppid, depth, root)
        memory = Memory.read(pid, root: root)
        Node.new(pid: pid, ppid: ppid, depth: depth, command: command(pid, root: root), memory: memory,
                 kernel_thread: memory.equal?(Memory::NONE) && ProcFS.kernel_thread?(pid, root: root))
      end
    end
  end
end
