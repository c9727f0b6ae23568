# frozen_string_literal: true

require_relative "../memkit"
require "rbconfig"
require_relative "allocator"
require_relative "cgroup"
require_relative "doctor/probe_runner"

module Memkit
  # The settings and limits that decide how much memory a forking Ruby
  # server uses, each read from /proc and /sys (or measured) with a status
  # and one line of advice.
  #
  #   Memkit::Doctor.new.checks             # this process and its Ruby
  #   Memkit::Doctor.new(pid: 1234).checks  # a running server: its environ, limits, cgroup
  #
  # Ruby-side facts (version, GC features, fiber stack sizes, whether fiber
  # stacks go back to the OS) come from a short-lived probe run by the same
  # Ruby binary with the same RUBY_*/MALLOC_* environment as the target, so
  # they are measured for that build rather than assumed from its version.
  class Doctor
    STATUSES = %i[ok warn fail].freeze

    Check = Struct.new(:name, :value, :status, :advice, keyword_init: true) do
      def to_h = { name: name, value: value, status: status.to_s, advice: advice }
    end

    # Variables copied from the target into the probe: the ones that change
    # how Ruby and malloc lay out memory.
    PROBE_ENV = /\A(RUBY_(GC|FIBER|THREAD|SHARED_FIBER)_|MALLOC_|
                  GLIBC_TUNABLES\z|LD_PRELOAD\z|LD_LIBRARY_PATH\z|RUBY_YJIT_ENABLE\z)/x

    attr_reader :pid

    # pid: nil for this process. probe: false skips the Ruby probe (the
    # measured fiber and GC checks). fibers: how many fibers the probe makes.
    # timeout: seconds the probe may run before it is killed and its checks
    # are reported as not measured.
    def initialize(pid: nil, probe: true, fibers: 1000, timeout: 60)
      @pid = pid.nil? ? nil : ProcFS.pid!(pid)
      @probe = probe
      @fibers = fibers
      raise InvalidArgument, "Doctor fibers: expected a positive Integer, got #{fibers.inspect}" unless
        fibers.is_a?(Integer) && fibers.positive?
      raise InvalidArgument, "Doctor timeout: expected a positive number of seconds, got #{timeout.inspect}" unless
        timeout.is_a?(Numeric) && timeout.positive?

      @timeout = timeout
    end

    def checks
      @checks ||= begin
        target = @pid || Process.pid
        ProcFS.read(target, "stat") # fail early, with NoSuchProcess or PermissionDenied
        raise_if_kernel_thread(target)
        probe = ruby_probe
        list = ruby_checks(probe)
        list << guarded("gc.env") { gc_env }
        list << guarded("allocator") { allocator }
        list << guarded("MALLOC_ARENA_MAX") { malloc_arena_max }
        list << guarded("transparent_hugepage") { transparent_hugepage }
        list << guarded("vm.max_map_count") { max_map_count(probe) }
        list << guarded("vm.overcommit_memory") { overcommit }
        list << guarded("swap") { swap }
        list << guarded("cgroup.memory") { cgroup_memory }
        list << guarded("rlimit.address_space") { address_space_limit(probe) }
        list.compact
      end
    end

    def to_h = { checks: checks.map(&:to_h) }

    def [](name) = checks.find { |c| c.name == name }

    private

    def target = @pid || Process.pid

    # The target's threads named as MallocRelease's (the kernel keeps 15 bytes of a name).
    def memkit_tasks
      Dir.glob("/proc/#{target}/task/*/comm").count do |comm|
        File.read(comm).chomp == MallocRelease::THREAD[0, 15]
      rescue SystemCallError
        false
      end
    end

    # kthreadd and its children have no user address space, so their
    # environ, maps and exe read as if the process were gone.
    def raise_if_kernel_thread(pid)
      return unless ProcFS.kernel_thread?(pid)

      name = Tree.command(pid).delete("[]")
      raise KernelThread, "pid #{pid} (#{name}) is a kernel thread: it has no user memory to diagnose"
    end

    # The status of a resource used to the fraction `used` of its limit.
    def level(used, warn:, fail: 0.9)
      if used >= fail then :fail
      elsif used >= warn then :warn
      else :ok
      end
    end

    def check(name, value, status, advice)
      raise ArgumentError, "status #{status.inspect}" unless STATUSES.include?(status)

      Check.new(name: name, value: value, status: status, advice: advice)
    end

    # The target's environment: ENV for this process, /proc/PID/environ (as
    # it was at exec; later setenv calls are invisible) for another.
    def environ
      @environ ||=
        if @pid.nil?
          ENV.to_h
        else
          ProcFS.read(@pid, "environ").split("\0").filter_map { |kv| kv.split("=", 2) if kv.include?("=") }.to_h
        end
    end

    def environ_or_nil
      environ
    rescue PermissionDenied
      nil
    end

    def read_sys(path) = File.read(path).strip

    # Another user's process hides some /proc files: that check says so and
    # the others still run.
    def guarded(name)
      yield
    rescue PermissionDenied => e
      check(name, nil, :warn, "#{e.message}: run memkit doctor as the same user or root")
    end

    # --- Ruby, measured by the probe -----------------------------------

    def ruby_binary
      return RbConfig.ruby if @pid.nil?

      exe = File.readlink("/proc/#{@pid}/exe")
      return nil if exe.end_with?(" (deleted)") || !File.basename(exe).match?(/ruby/)

      exe
    rescue SystemCallError
      nil
    end

    def ruby_probe
      return { skipped: "--no-probe" } unless @probe

      ruby = ruby_binary
      return { skipped: "pid #{@pid} does not run a Ruby binary memkit can start (#{exe_name})" } unless ruby

      env = environ_or_nil
      return { skipped: "cannot read /proc/#{@pid}/environ (run as the same user or root)" } unless env

      probe_env = env.select { |k, _| k.match?(PROBE_ENV) }
      probe_env["PATH"] = ENV.fetch("PATH", "/usr/bin:/bin")
      ProbeRunner.new(ruby: ruby, env: probe_env, args: [@fibers], timeout: @timeout).call
    end

    def exe_name
      File.readlink("/proc/#{@pid}/exe")
    rescue SystemCallError
      "exe unreadable"
    end

    def ruby_checks(probe)
      if probe[:skipped]
        status = @probe ? :warn : :ok
        value = @pid ? nil : RUBY_DESCRIPTION
        return [check("ruby", value, status, "fiber and GC measurements skipped: #{probe[:skipped]}")]
      end

      list = []
      f = probe[:features]
      advice = if f[:process_warmup]
                 "Process.warmup exists: call it (or Memkit.warmup) in the master right before forking workers"
               else
                 "no Process.warmup (Ruby 3.3+): call Memkit.warmup in the master before forking workers"
               end
      list << check("ruby", probe[:description], :ok, advice)
      compact = f[:gc_compact] ? "available (compact before fork to pack the shared heap)" : "unavailable"
      pools = f[:size_pools] ? "#{f[:size_pools]} heap size pools" : "one heap slot size"
      list << check("gc.features", f, :ok, "#{pools}; GC.compact #{compact}")
      list << young_objects_after_fork(probe[:age])
      list << fiber_stack_size(probe[:fiber])
      list << fiber_stack_release(probe[:fiber])
      list
    end

    def young_objects_after_fork(age)
      return check("gc.young_objects_after_fork", nil, :warn, "not measured: #{age[:error]}") if age[:error]

      per = age[:dirtied].fdiv(age[:objects]).round(1)
      share = age[:dirtied].fdiv(age[:heap_bytes])
      value = { "objects" => age[:objects], "heap_bytes" => age[:heap_bytes], "dirtied_bytes" => age[:dirtied],
                "bytes_per_object" => per }
      if share >= 0.25
        check("gc.young_objects_after_fork", value, :warn,
              "one minor GC in a fork child copied #{(share * 100).round}% of the pages holding objects that were " \
              "young at fork (their age and mark flags are written): make them old before forking " \
              "(Process.warmup / Memkit.warmup)")
      else
        check("gc.young_objects_after_fork", value, :ok,
              "a minor GC in a fork child copied only #{(share * 100).round}% of the young objects' pages")
      end
    end

    def gc_env
      env = environ_or_nil
      return check("gc.env", nil, :warn, "cannot read /proc/#{@pid}/environ (run as the same user or root)") unless env

      vars = env.select { |k, _| k.start_with?("RUBY_GC_") }.sort.to_h
      advice = if vars.empty?
                 "no RUBY_GC_* variables: Ruby's defaults (a larger RUBY_GC_HEAP_INIT_SLOTS-style start avoids " \
                   "GCs during boot, but measure before tuning)"
               else
                 "set: #{vars.keys.join(', ')}; they are read once at boot, so a worker inherits its master's"
               end
      status = vars.any? { |k, v| k.include?("GROWTH_FACTOR") && v.to_f.positive? && v.to_f < 1.0 } ? :warn : :ok
      check("gc.env", vars, status, advice)
    end

    def fiber_stack_size(fiber)
      vm = fiber[:vm_stack_size]
      machine = fiber[:machine_stack_size]
      value = { "vm_stack_size" => vm, "machine_stack_size" => machine,
                "address_space_per_fiber" => fiber[:address_space_per_fiber] }
      env = (environ_or_nil || {}).slice("RUBY_FIBER_VM_STACK_SIZE", "RUBY_FIBER_MACHINE_STACK_SIZE")
      set = env.empty? ? "defaults" : env.map { |k, v| "#{k}=#{v}" }.join(" ")
      check("fiber.stack_size", value, :ok,
            "#{set}: each live fiber reserves #{Units.human(fiber[:address_space_per_fiber])} of address space " \
            "and touches #{Units.human(fiber[:rss_per_fiber])}; lower RUBY_FIBER_MACHINE_STACK_SIZE only if no " \
            "job recurses deeply")
    end

    def fiber_stack_release(fiber)
      value = fiber[:release]
      peak = fiber[:peak_rss] - fiber[:base_rss]
      case value
      when "returned"
        check("fiber.stack_release", value, :ok,
              "finished fibers' stacks were given back at once (RSS fell from +#{Units.human(peak)})")
      when "lazy"
        check("fiber.stack_release", value, :ok,
              "finished fibers' stacks are freed lazily (MADV_FREE: #{Units.human(fiber[:lazy_free])} LazyFree); " \
              "RSS keeps counting them until memory is short, so RSS-based worker killers see a burst as growth")
      else
        check("fiber.stack_release", value, :warn,
              "this build keeps finished fibers' stacks resident (#{Units.human(peak)} stayed after " \
              "#{fiber[:count]} fibers ended and GC ran): a burst of fibers raises RSS for good; bound " \
              "concurrent fibers (Memkit::FiberPool max:) or restart workers")
      end
    end

    # --- allocator ------------------------------------------------------

    def allocator
      name = Allocator.name(target)
      advice = if name == "glibc"
                 "glibc malloc: one arena per thread up to 8 x cores fragments threaded servers; set " \
                   "MALLOC_ARENA_MAX=2 or preload jemalloc (LD_PRELOAD=libjemalloc.so.2)"
               else
                 "#{name} is loaded: it returns freed memory on its own schedule"
               end
      check("allocator", name, :ok, advice)
    end

    def malloc_arena_max
      env = environ_or_nil
      unless env
        return check("MALLOC_ARENA_MAX", nil, :warn, "cannot read /proc/#{@pid}/environ (run as the same user or root)")
      end

      value = env["MALLOC_ARENA_MAX"]
      # For this process, its Ruby threads: the kernel's count also has the
      # VM's timer thread (Ruby 3.3+), which is not a server thread. Neither
      # is MallocRelease's, which between trims only reads counters.
      threads = if @pid
                  Status.read(target).threads - memkit_tasks
                else
                  Thread.list.count { |t| t.name != MallocRelease::THREAD }
                end
      glibc = allocator.value == "glibc"
      if !glibc
        check("MALLOC_ARENA_MAX", value, :ok, "not glibc malloc: MALLOC_ARENA_MAX does not apply")
      elsif value
        check("MALLOC_ARENA_MAX", value, :ok, "glibc creates at most #{value} malloc arenas")
      elsif threads > 1
        check("MALLOC_ARENA_MAX", nil, :warn,
              "unset with #{threads} threads: glibc may create up to #{8 * Etc.nprocessors} arenas; " \
              "MALLOC_ARENA_MAX=2 usually saves memory for threaded servers (Puma, Sidekiq)")
      else
        check("MALLOC_ARENA_MAX", nil, :ok, "unset, but the process has one thread, so one arena")
      end
    end

    # --- kernel -------------------------------------------------------

    def transparent_hugepage
      path = "/sys/kernel/mm/transparent_hugepage/enabled"
      raw = read_sys(path)
      mode = raw[/\[(\w+)\]/, 1] or raise ParseError, "#{path}: no [mode] in #{raw.inspect}"
      case mode
      when "always"
        check("transparent_hugepage", mode, :warn,
              "THP always: one write after fork can copy a 2 MiB page instead of 4 KiB, undoing copy-on-write " \
              "sharing; use madvise or never for forking servers")
      else
        check("transparent_hugepage", mode, :ok, "#{mode}: Ruby's heap is not backed by huge pages behind its back")
      end
    rescue Errno::ENOENT
      check("transparent_hugepage", nil, :ok, "no THP support in this kernel")
    end

    def max_map_count(probe)
      limit = read_sys("/proc/sys/vm/max_map_count").to_i
      per_fiber = probe.dig(:fiber, :mappings_per_fiber) || 2.0
      begin
        maps = ProcFS.read(target, "maps").count("\n")
      rescue PermissionDenied
        return check("vm.max_map_count", limit, :ok,
                     "about #{(limit / per_fiber).floor} live fibers per process at most (#{per_fiber} mappings " \
                     "each); pid #{target}'s own mappings are hidden from this user")
      end
      fibers = ((limit - maps) / [per_fiber, 0.01].max).floor
      used = maps.fdiv(limit)
      status = level(used, warn: 0.5)
      check("vm.max_map_count", limit, status,
            "pid #{target} has #{maps} mappings; each live fiber adds #{per_fiber} (stack and guard page), so " \
            "about #{fibers} more live fibers fit before \"can't set a guard page\"; raise it with " \
            "sysctl vm.max_map_count if you run that many")
    end

    def overcommit
      mode = read_sys("/proc/sys/vm/overcommit_memory").to_i
      case mode
      when 2
        ratio = read_sys("/proc/sys/vm/overcommit_ratio")
        check("vm.overcommit_memory", mode, :warn,
              "strict accounting (ratio #{ratio}%): every fork commits the master's whole private memory even " \
              "though copy-on-write shares it, so forking workers can fail with ENOMEM")
      when 1
        check("vm.overcommit_memory", mode, :ok,
              "always overcommit: forks never fail for commit charge; the OOM killer decides")
      else
        check("vm.overcommit_memory", mode, :ok, "heuristic overcommit (the default): forking a large master is fine")
      end
    end

    def swap
      meminfo = ProcFS.kb_fields(File.read("/proc/meminfo"))
      total = meminfo.fetch("SwapTotal", 0)
      process = Status.read(target).vm_swap
      swappiness = read_sys("/proc/sys/vm/swappiness").to_i
      value = { "total" => total, "free" => meminfo.fetch("SwapFree", 0), "process" => process,
                "swappiness" => swappiness }
      if total.zero?
        check("swap", value, :ok, "no swap: when memory runs out the OOM killer ends a process instead of slowing it")
      elsif process.positive?
        check("swap", value, :warn,
              "pid #{target} has #{Units.human(process)} swapped out: reading it back stalls requests, and pss/rss " \
              "understate its real size")
      else
        check("swap", value, :ok, "swap is on (swappiness #{swappiness}); pid #{target} has nothing swapped out")
      end
    end

    # cgroup v2 (memory.max, memory.current) or v1 (memory.limit_in_bytes,
    # memory.usage_in_bytes), read by Memkit::Cgroup.
    def cgroup_memory
      cgroup = Cgroup.read(target)
      value = { "version" => cgroup.version, "path" => cgroup.path, "max" => cgroup.limit, "current" => cgroup.usage }
      unless cgroup.limited?
        return check("cgroup.memory", value, :ok, "no limit on #{cgroup.path}; usage #{Units.human(cgroup.usage)}")
      end

      used = cgroup.usage.fdiv(cgroup.limit)
      status = level(used, warn: 0.75)
      check("cgroup.memory", value, status,
            "#{Units.human(cgroup.usage)} of #{Units.human(cgroup.limit)} (#{(used * 100).round}%) used, " \
            "page cache included; at the limit the kernel reclaims cache, then OOM-kills inside the container")
    rescue Cgroup::NotFound
      check("cgroup.memory", nil, :ok, "no memory cgroup controller mounted: no container limit")
    rescue ParseError, PermissionDenied => e
      check("cgroup.memory", nil, :warn, "cannot read the memory cgroup: #{e.message}")
    end

    def address_space_limit(probe)
      limits = ProcFS.read(target, "limits")
      line = limits.lines.find { |l| l.start_with?("Max address space") } or return nil
      soft = line.split[3]
      if soft == "unlimited"
        return check("rlimit.address_space", "unlimited", :ok, "no RLIMIT_AS: fiber stacks only cost address space")
      end

      limit = soft.to_i
      size = Status.read(target).vm_size
      per = probe.dig(:fiber, :address_space_per_fiber)
      status = size.fdiv(limit) >= 0.8 ? :warn : :ok
      check("rlimit.address_space", limit, status,
            "#{Units.human(size)} of #{Units.human(limit)} address space in use" \
            "#{per ? "; each live fiber reserves #{Units.human(per)}" : ''}: mmap fails at the limit")
    end
  end
end
