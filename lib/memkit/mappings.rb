# frozen_string_literal: true

module Memkit
  # A process's memory grouped by what the mappings in /proc/PID/smaps hold.
  class Mappings
    # One line of smaps' header plus its fields, sizes in bytes.
    # vm_flags: smaps' VmFlags two-letter codes ("rd wr gu ..."), "" when absent.
    Mapping = Struct.new(:start, :finish, :perms, :path, :size, :rss, :pss, :private_dirty, :swap, :vm_flags,
                         keyword_init: true) do
      # Linux 5.17+ shows prctl(PR_SET_VMA_ANON_NAME) names as "[anon:NAME]".
      def anonymous? = path.empty? || path.start_with?("[anon:")
      def guard? = perms.start_with?("---")

      # Linux 6.13+ can put a guard inside a mapping (MADV_GUARD_INSTALL)
      # instead of a PROT_NONE mapping below it, and smaps then flags the
      # mapping "gu". glibc 2.42+ guards thread stacks this way, so there a
      # thread stack is one rw-p mapping with no separate guard below it.
      def guard_region? = vm_flags.to_s.split.include?("gu")
    end

    # Sums for one kind of mapping.
    Group = Struct.new(:kind, :count, :size, :rss, :pss, :private_dirty, :swap, keyword_init: true) do
      def add(mapping)
        self.count += 1
        %i[size rss pss private_dirty swap].each { |f| self[f] += mapping[f] }
      end
    end

    KINDS = {
      heap: "brk heap: malloc arena 0 and, on Ruby < 3.3, most Ruby heap pages",
      anonymous: "anonymous mmaps: Ruby heap pages, malloc arenas and large allocations",
      stacks: "thread and fiber stacks (anonymous mappings above or holding a guard) and the main stack",
      guard: "guard pages and reserved address space (never resident)",
      libraries: "shared libraries (.so) and the executable",
      files: "other mapped files",
      shared_memory: "shared memory (memfd, /dev/zero, SysV)",
      kernel: "vdso, vvar, vsyscall"
    }.freeze

    MAX_GUARD = 64 * 1024

    HEADER = /\A(\h+)-(\h+) (\S{4}) \h+ \S+ \d+ *(.*)\z/n

    attr_reader :mappings

    def self.read(pid, root: "/proc")
      pid = ProcFS.pid!(pid)
      text = ProcFS.read(pid, "smaps", root: root)
      raise NoSuchProcess, "pid #{pid} exited while its mappings were read" if text.empty?

      exe = begin
        File.readlink("#{root}/#{pid}/exe")
      rescue SystemCallError
        nil # kernel threads have no executable; ptrace rules may hide it
      end
      new(parse(text, "/proc/#{pid}/smaps"), exe: exe&.b)
    end

    def self.parse(text, file = "smaps")
      mappings = []
      fields = nil
      ProcFS.binary(text).each_line(chomp: true) do |line|
        if (m = HEADER.match(line))
          fields = {}
          mappings << [m, fields]
        elsif fields && (kv = line.match(/\A(\w+):\s+(\d+) kB\z/))
          fields[kv[1]] = kv[2].to_i * 1024
        elsif fields && line.start_with?("VmFlags:")
          fields["VmFlags"] = line.delete_prefix("VmFlags:").strip
        end
      end
      mappings.map do |m, f|
        get = ->(key) { f.fetch(key) { raise ParseError, "#{file}: mapping #{m[1]} has no #{key} field" } }
        Mapping.new(start: m[1].to_i(16), finish: m[2].to_i(16), perms: m[3], path: m[4],
                    size: get.("Size"), rss: get.("Rss"), pss: get.("Pss"),
                    private_dirty: get.("Private_Dirty"), swap: f.fetch("Swap", 0), vm_flags: f.fetch("VmFlags", ""))
      end
    end

    def initialize(mappings, exe: nil)
      @mappings = mappings
      @exe = exe
    end

    # {kind => Group}, every kind present (empty groups have count 0).
    def groups
      @groups ||= begin
        empty = { count: 0, size: 0, rss: 0, pss: 0, private_dirty: 0, swap: 0 }
        groups = KINDS.keys.to_h { |k| [k, Group.new(kind: k, **empty)] }
        mappings.each_with_index { |m, i| groups[kind_of(m, i.zero? ? nil : mappings[i - 1])].add(m) }
        groups
      end
    end

    def to_h
      groups.transform_values { |g| g.to_h.except(:kind) }
    end

    private

    def kind_of(mapping, below)
      path = mapping.path
      return :guard if mapping.guard?
      return :stacks if path == "[stack]" || path.start_with?("[stack:")
      return :heap if path == "[heap]"
      return :kernel if path.start_with?("[v")

      if mapping.anonymous?
        return :stacks if mapping.guard_region?

        # Thread stacks (glibc) and fiber stacks (Ruby's fiber pool) sit directly
        # above a guard of a page or a few. A malloc arena's reserve is PROT_NONE
        # too, but megabytes long, and can end right below the next arena.
        guarded = below&.guard? && below.anonymous? && below.finish == mapping.start &&
                  below.size <= MAX_GUARD
        return guarded ? :stacks : :anonymous
      end
      if path.start_with?("/dev/zero", "/SYSV", "/memfd:", "[anon_shmem") ||
         (path.include?("(deleted)") && mapping.perms[3] == "s")
        return :shared_memory
      end
      return :libraries if path == @exe || path.match?(/\.so(\.[\d.]+)?(\s|\z)/)

      :files
    end
  end
end
