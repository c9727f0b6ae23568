# frozen_string_literal: true

require "etc"

module Memkit
  # Reads files under /proc and turns the kernel's errno values into
  # Memkit errors that name the pid and the file.
  module ProcFS
    PAGE_SIZE = Etc.sysconf(Etc::SC_PAGESIZE)

    module_function

    # The pid as an Integer, or InvalidArgument. Accepts "123" from a CLI.
    def pid!(pid)
      return pid if pid.is_a?(Integer) && pid.positive?

      Integer(pid, 10).tap { |n| raise ArgumentError unless n.positive? }
    rescue ArgumentError, TypeError
      raise InvalidArgument, "not a pid: #{pid.inspect}"
    end

    # Binary, because /proc shows file names and process names byte for byte,
    # and those need not be valid UTF-8.
    def read(pid, name, root: "/proc")
      File.binread("#{root}/#{pid}/#{name}")
    rescue SystemCallError => e
      raise translate(e, pid, name, root)
    end

    # Translate an errno raised while reading /proc/PID/NAME into a Memkit error.
    def translate(error, pid, name, root = "/proc")
      file = "#{root}/#{pid}/#{name}"
      case error
      when Errno::EACCES, Errno::EPERM
        PermissionDenied.new("permission denied reading #{file} (pid #{pid} belongs to another user?)")
      when Errno::ENOENT, Errno::ESRCH
        # Ask about this process's own file, not the target's: a process that is
        # exiting loses its files too, and that must not look like an old kernel.
        if !File.exist?("#{root}/self/stat")
          Unsupported.new("#{root} is not a Linux procfs: memkit reads /proc/PID files (Linux only)")
        elsif !File.exist?("#{root}/self/#{name}")
          Unsupported.new("#{root}/self/#{name} does not exist on this kernel")
        else
          NoSuchProcess.new("no such process: pid #{pid}")
        end
      else
        Error.new("cannot read #{file}: #{error.message}")
      end
    end

    # Parses "Key:   123 kB" lines into {"Key" => bytes}. Repeated keys are
    # summed, which turns a whole smaps file into its totals in one pass.
    def kb_fields(text, into = {})
      binary(text).scan(/^(\w+):[ \t]+(\d+) kB$/) do |key, kb|
        into[key] = into.fetch(key, 0) + kb.to_i * 1024
      end
      into
    end

    def binary(text)
      text.encoding == Encoding::BINARY ? text : text.b
    end

    # Fields of /proc/PID/stat from the state on (index 0 is the state, 1 the
    # ppid, 6 the flags), or nil if the process is gone. The comm field
    # before them may hold spaces and parentheses, so they start after the
    # last ')'.
    def stat_fields(pid, root: "/proc")
      stat = File.binread("#{root}/#{pid}/stat")
      close = stat.rindex(")") or return nil
      stat[(close + 2)..].split(" ")
    rescue SystemCallError
      nil
    end

    # pid => ppid for every process, from one pass over /proc/*/stat: the
    # one place memkit finds parents (Tree, Cow, the soak's TreeSampler).
    # A process that exits during the pass is left out.
    def parents(root: "/proc")
      pids(root: root).each_with_object({}) do |pid, map|
        fields = stat_fields(pid, root: root) or next
        map[pid] = fields[1].to_i
      end
    end

    # ppid => [child pids, sorted], from the same pass (or from a parents
    # map already read); only pids that have children are keys.
    def children(root: "/proc", parents: self.parents(root: root))
      parents.group_by { |_, ppid| ppid }.transform_values { |pairs| pairs.map(&:first).sort }
    end

    # PF_KTHREAD in the flags of /proc/PID/stat: a kernel thread, which has
    # no user address space, so no rss, smaps or maps to read.
    PF_KTHREAD = 0x00200000

    def kernel_thread?(pid, root: "/proc")
      fields = stat_fields(pid, root: root) or return false
      (fields[6].to_i & PF_KTHREAD) != 0
    end

    # All pids currently in /proc, as Integers.
    def pids(root: "/proc")
      unless File.exist?("#{root}/self/stat")
        raise Unsupported, "#{root} is not a Linux procfs: memkit reads /proc/PID files (Linux only)"
      end

      Dir.children(root).filter_map { |name| name.to_i if name.match?(/\A\d+\z/) }
    rescue SystemCallError => e
      raise Unsupported, "cannot list #{root}: #{e.message}"
    end
  end
end
