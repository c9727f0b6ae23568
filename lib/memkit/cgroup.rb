# frozen_string_literal: true

require_relative "../memkit"

module Memkit
  # The memory limit and usage of a process's cgroup: what a container runtime
  # (Docker, Kubernetes, systemd) enforces, and what the kernel's OOM killer
  # acts on when the limit is reached.
  #
  #   Memkit::Cgroup.read            # this process
  #   Memkit::Cgroup.read(1234)      # another one
  #   Memkit::Cgroup.read(root: "test/fixtures/cgroup/v2-limited") # a recorded tree
  #
  # The cgroup is found through /proc/PID/cgroup and /proc/self/mountinfo, so
  # it works inside a container (cgroup namespace, the container's cgroup
  # mounted at /sys/fs/cgroup) and on a host (the process's cgroup below the
  # mount). cgroup v2 is used where it has the memory controller, else v1.
  #
  # The effective limit is the smallest on the way from the process's cgroup
  # up to the mount's root: a runtime often limits a parent (the pod, the
  # slice), and the kernel enforces every level.
  class Cgroup
    # No memory cgroup to read: not Linux, no cgroup file system mounted, or
    # no memory controller in it.
    class NotFound < Error; end

    # cgroup v1 writes "no limit" as the largest page-aligned long
    # (9223372036854771712); anything this large is no limit.
    UNLIMITED_FROM = 1 << 62

    # One reading. Bytes are Integers; limit and high are nil when unlimited.
    # limit: the effective hard limit (memory.max / memory.limit_in_bytes);
    # high: v2's throttling limit (memory.high), nil on v1 or when unset;
    # usage: memory.current / memory.usage_in_bytes, page cache included;
    # inactive_file: page cache the kernel reclaims first (memory.stat);
    # events: v2's memory.events ("max", "oom", "oom_kill", ...), or on v1
    #   "failcnt" and oom_control's "oom_kill" where the kernel has it;
    # limited_at: the directory whose limit is the effective one.
    Reading = Struct.new(:version, :path, :limit, :high, :usage, :inactive_file, :events, :limited_at,
                         keyword_init: true) do
      def limited? = !limit.nil?

      # Usage less the reclaimable page cache: what Kubernetes calls the
      # working set and compares with the limit to evict a pod.
      def working_set = [usage - inactive_file.to_i, 0].max

      # Share of the limit in use (working set), or nil when unlimited.
      def used_ratio = limit && working_set.fdiv(limit)

      def to_h = super.merge(events: events.dup)
    end

    class << self
      # Reading for pid ("self" or an Integer). root: where the file system
      # starts, for recorded trees (root/proc/PID/cgroup, root/proc/self/mountinfo,
      # and the mount points below root).
      def read(pid = "self", root: "/")
        new(pid, root: root).read
      end
    end

    def initialize(pid = "self", root: "/")
      @pid = pid
      @root = root
    end

    def read
      dir, version, mount_root = locate
      version == 2 ? read_v2(dir, mount_root) : read_v1(dir, mount_root)
    end

    private

    def read_v2(dir, mount_root)
      limit, limited_at = smallest(dir, mount_root) { |d| bytes_or_max(d, "memory.max") }
      high, = smallest(dir, mount_root) { |d| bytes_or_max(d, "memory.high") }
      stat = key_values(File.join(dir, "memory.stat"), optional: true)
      Reading.new(version: 2, path: dir, limit: limit, high: high, usage: integer(File.join(dir, "memory.current")),
                  inactive_file: stat.fetch("inactive_file", 0), events: key_values(File.join(dir, "memory.events")),
                  limited_at: limited_at)
    end

    def read_v1(dir, mount_root)
      stat = key_values(File.join(dir, "memory.stat"), optional: true)
      limit, limited_at = smallest(dir, mount_root) { |d| bytes_or_max(d, "memory.limit_in_bytes") }
      # The kernel's own answer for the whole hierarchy, where it gives one.
      hierarchical = stat["hierarchical_memory_limit"]
      if hierarchical && hierarchical < UNLIMITED_FROM && (limit.nil? || hierarchical < limit)
        limit = hierarchical
        limited_at = nil
      end
      events = {}
      failcnt = File.join(dir, "memory.failcnt")
      events["failcnt"] = integer(failcnt) if File.exist?(failcnt)
      oom = key_values(File.join(dir, "memory.oom_control"), optional: true)
      events["oom_kill"] = oom.fetch("oom_kill") if oom.key?("oom_kill")
      usage = integer(File.join(dir, "memory.usage_in_bytes"))
      Reading.new(version: 1, path: dir, limit: limit, high: nil, usage: usage,
                  inactive_file: stat.fetch("total_inactive_file") { stat.fetch("inactive_file", 0) }, events: events,
                  limited_at: limited_at)
    end

    # [smallest limit, directory that sets it] from dir up to mount_root.
    def smallest(dir, mount_root)
      best = nil
      at = nil
      loop do
        value = yield(dir) if File.exist?(dir)
        if value && (best.nil? || value < best)
          best = value
          at = dir
        end
        break if dir == mount_root || dir.length <= mount_root.length

        dir = File.dirname(dir)
      end
      [best, at]
    end

    # Integer, or nil for "max" / v1's unlimited / a file that is not there
    # (memory.max does not exist in a v2 root cgroup).
    def bytes_or_max(dir, name)
      file = File.join(dir, name)
      return nil unless File.exist?(file)

      text = File.read(file).strip
      return nil if text == "max"

      value = parse_integer(text, file)
      value >= UNLIMITED_FROM ? nil : value
    end

    def integer(file)
      parse_integer(File.read(file).strip, file)
    rescue Errno::ENOENT, Errno::EACCES => e
      raise NotFound, "cannot read #{file}: #{e.message}"
    end

    def parse_integer(text, file)
      Integer(text, 10)
    rescue ArgumentError
      raise ParseError, "#{file}: expected a number of bytes, got #{text[0, 40].inspect}"
    end

    # "key value" lines (memory.stat, memory.events, memory.oom_control).
    def key_values(file, optional: false)
      File.readlines(file, chomp: true).each_with_object({}) do |line, h|
        key, value = line.split(" ", 2)
        next if key.nil?

        h[key] = parse_integer(value.to_s.strip, file)
      end
    rescue Errno::ENOENT, Errno::EACCES => e
      return {} if optional

      raise NotFound, "cannot read #{file}: #{e.message}"
    end

    # [directory, version, the mount's root directory]
    def locate
      lines = read_text(proc_path(@pid, "cgroup")).lines(chomp: true).map { |l| l.split(":", 3) }
      mounts = read_text(proc_path("self", "mountinfo")).lines(chomp: true).map(&:split)
      v2 = lines.find { |id, controllers, _| id == "0" && controllers.empty? }
      if v2 && (mount = mounts.find { |f| fstype(f) == "cgroup2" })
        dir, top = path_in(mount, v2[2])
        return [dir, 2, top] if File.exist?(File.join(dir, "memory.current"))
      end
      v1 = lines.find { |_, controllers, _| controllers.split(",").include?("memory") }
      if v1 && (mount = mounts.find { |f| fstype(f) == "cgroup" && f.last.split(",").include?("memory") })
        dir, top = path_in(mount, v1[2])
        return [dir, 1, top] if File.exist?(File.join(dir, "memory.usage_in_bytes"))
      end
      raise NotFound, "no memory cgroup for pid #{@pid} (#{proc_path(@pid, 'cgroup')} names none that is mounted)"
    end

    # mountinfo: field 4 is the cgroup path mounted there (not "/" when the
    # host's hierarchy is bind-mounted in part), field 5 the mount point; the
    # file system type follows the "-" separator.
    def fstype(fields)
      sep = fields.index("-")
      sep && fields[sep + 1]
    end

    def path_in(mount, path)
      mounted = mount[3]
      mount_point = File.join(@root, mount[4]).chomp("/")
      rel = path.start_with?(mounted) ? path.delete_prefix(mounted) : path
      # With a cgroup namespace, /proc/PID/cgroup may say "/.." for a process
      # outside it: its cgroup cannot be seen from here.
      raise NotFound, "pid #{@pid} is in a cgroup outside this namespace (#{path})" if rel.start_with?("/..")

      [File.join(mount_point, rel).chomp("/"), mount_point]
    end

    def proc_path(pid, name) = File.join(@root, "proc", pid.to_s, name)

    def read_text(file)
      File.read(file)
    rescue Errno::ENOENT, Errno::ESRCH => e
      if file.include?("/#{@pid}/") && @pid != "self" && @root == "/"
        raise NoSuchProcess, "no such process: pid #{@pid} (#{file})"
      end

      raise NotFound, "cannot read #{file}: #{e.message}"
    rescue Errno::EACCES => e
      raise PermissionDenied, "cannot read #{file}: #{e.message}"
    end
  end
end
