# frozen_string_literal: true

require "test_helper"
require "json"

class DoctorTest < Minitest::Test
  def doctor(**opts)
    @doctors ||= {}
    @doctors[opts] ||= Memkit::Doctor.new(**opts)
  end

  def test_every_check_has_a_name_value_status_and_advice
    checks = doctor.checks
    assert_operator checks.size, :>=, 12
    checks.each do |c|
      assert_includes %i[ok warn fail], c.status, c.name
      refute_empty c.advice.to_s, c.name
    end
    names = checks.map(&:name)
    %w[ruby gc.features gc.young_objects_after_fork gc.env fiber.stack_size fiber.stack_release allocator
       MALLOC_ARENA_MAX transparent_hugepage vm.max_map_count vm.overcommit_memory swap cgroup.memory
       rlimit.address_space].each { |n| assert_includes names, n }
    assert_equal names.uniq, names
  end

  def test_kernel_values_are_exactly_what_proc_and_sys_say
    assert_equal File.read("/proc/sys/vm/max_map_count").to_i, doctor["vm.max_map_count"].value
    thp = File.read("/sys/kernel/mm/transparent_hugepage/enabled")[/\[(\w+)\]/, 1]
    assert_equal thp, doctor["transparent_hugepage"].value
    assert_equal File.read("/proc/sys/vm/overcommit_memory").to_i, doctor["vm.overcommit_memory"].value
    swap = doctor["swap"].value
    meminfo = File.read("/proc/meminfo")
    assert_equal meminfo[/^SwapTotal:\s+(\d+) kB/, 1].to_i * 1024, swap["total"]
    assert_equal File.read("/proc/sys/vm/swappiness").to_i, swap["swappiness"]
    assert_equal File.read("/proc/self/status")[/^VmSwap:\s+(\d+) kB/, 1].to_i * 1024, swap["process"]
  end

  def test_ruby_values_are_this_rubys
    assert_equal RUBY_DESCRIPTION, doctor["ruby"].value
    assert_equal Process.respond_to?(:warmup), doctor["gc.features"].value[:process_warmup]
    size = doctor["fiber.stack_size"].value
    assert_equal RubyVM::DEFAULT_PARAMS[:fiber_vm_stack_size], size["vm_stack_size"]
    assert_equal RubyVM::DEFAULT_PARAMS[:fiber_machine_stack_size], size["machine_stack_size"]
    # Address space per fiber: the two stacks and a guard page, give or take
    # the share of the VM's pool allocation headers.
    assert_in_delta size["vm_stack_size"] + size["machine_stack_size"], size["address_space_per_fiber"],
                    64 * 1024
    expected = File.read("/proc/self/maps").match?(/libjemalloc/) ? "jemalloc" : "glibc"
    assert_equal expected, doctor["allocator"].value
  end

  # The memory cgroup the way the kernel names it for this process: v1's
  # memory controller line, or v2's "0::" line, under its mount point.
  def cgroup_files
    lines = File.readlines("/proc/self/cgroup", chomp: true).map { |l| l.split(":", 3) }
    mounts = File.readlines("/proc/self/mountinfo", chomp: true).map(&:split)
    if (v1 = lines.find { |_, c, _| c.split(",").include?("memory") }) &&
       (m = mounts.find { |f| f[f.index("-") + 1] == "cgroup" && f.last.split(",").include?("memory") })
      dir = File.join(m[4], v1[2].delete_prefix(m[3])).chomp("/")
      return [1, dir, "#{dir}/memory.limit_in_bytes", "#{dir}/memory.usage_in_bytes"]
    end
    v2 = lines.find { |id, _, _| id == "0" }
    m = mounts.find { |f| f[f.index("-") + 1] == "cgroup2" }
    return nil unless v2 && m

    dir = File.join(m[4], v2[2].delete_prefix(m[3])).chomp("/")
    [2, dir, "#{dir}/memory.max", "#{dir}/memory.current"] if File.exist?("#{dir}/memory.current")
  end

  def test_cgroup_limit_and_usage_come_from_the_cgroup_files
    files = cgroup_files
    value = doctor["cgroup.memory"].value
    if files.nil?
      assert_nil value
      return
    end
    version, dir, max_file, current_file = files
    assert_equal version, value["version"]
    assert_equal dir, value["path"]
    raw = File.read(max_file).strip
    unlimited = raw == "max" || raw.to_i >= 2**63 - 8192
    unlimited ? assert_nil(value["max"]) : assert_equal(raw.to_i, value["max"])
    # Usage moves while the test runs (other engineers' tests share this
    # cgroup): the doctor's figure lies between two reads around a fresh one.
    before = File.read(current_file).to_i
    fresh = Memkit::Doctor.new(probe: false)["cgroup.memory"].value["current"]
    after = File.read(current_file).to_i
    assert_operator fresh, :>=, [before, after].min - 64 * 1024 * 1024
    assert_operator fresh, :<=, [before, after].max + 64 * 1024 * 1024
  end

  def test_a_pid_is_read_through_its_own_environ_and_limits
    env = { "MALLOC_ARENA_MAX" => "3", "RUBY_GC_HEAP_GROWTH_FACTOR" => "1.25" }
    limit = 64 * 1024**3
    pid = spawn(env, RbConfig.ruby, "-e", "Thread.new { sleep }; sleep", rlimit_as: limit)
    # 30 s: with the three lanes of script/test on two cores, 10 s once ran out.
    wait_until(timeout: 30, message: "child ruby to start its second thread") do
      _, status = Process.wait2(pid, Process::WNOHANG)
      if status
        pid = nil
        flunk "the child ruby ended before its second thread started: #{status.inspect}"
      end
      File.read("/proc/#{pid}/status")[/^Threads:\s+(\d+)/, 1].to_i >= 2
    end
    d = Memkit::Doctor.new(pid: pid)
    assert_equal "3", d["MALLOC_ARENA_MAX"].value
    assert_equal({ "RUBY_GC_HEAP_GROWTH_FACTOR" => "1.25" }, d["gc.env"].value)
    soft = File.read("/proc/#{pid}/limits")[/^Max address space\s+(\d+)/, 1].to_i
    assert_equal soft, d["rlimit.address_space"].value
    assert_equal limit, d["rlimit.address_space"].value
    assert_match(/pid #{pid} has \d+ mappings/, d["vm.max_map_count"].advice)
    assert_equal RUBY_DESCRIPTION, d["ruby"].value, "the probe ran the pid's own Ruby binary"
    without = Memkit::Doctor.new(pid: pid, probe: false)
    assert_equal "3", without["MALLOC_ARENA_MAX"].value
    refute_equal "3", Memkit::Doctor.new(probe: false)["MALLOC_ARENA_MAX"].value, "this process's own value differs"
  ensure
    if pid
      Process.kill(:KILL, pid)
      Process.wait(pid)
    end
  end

  # An independent measurement with memkit's own smaps grouping, in a fork
  # child of this Ruby: fibers that use some stack, finished and collected.
  def measure_fiber_stack_release
    reader, writer = IO.pipe
    pid = fork do
      reader.close
      # MallocRelease's thread (started here by earlier tests' warmups) would
      # touch its own stack pages during the measurement.
      Memkit::MallocRelease.stop
      sleep 0.05 while Thread.list.any? { |t| t.name == Memkit::MallocRelease::THREAD }
      deep = ->(n) { n.zero? ? Fiber.yield : deep.(n - 1) }
      lazy = -> { File.read("/proc/self/smaps_rollup")[/^LazyFree:\s+(\d+) kB/, 1].to_i * 1024 }
      GC.start
      base = Memkit.mappings.groups[:stacks].rss
      lazy_base = lazy.call
      fibers = Array.new(800) { Fiber.new { deep.(60) }.tap(&:resume) }
      peak = Memkit.mappings.groups[:stacks].rss
      fibers.each(&:resume)
      fibers.clear
      GC.start
      GC.start
      after = Memkit.mappings.groups[:stacks].rss
      writer.write([base, peak, after, lazy.call - lazy_base].join(" "))
      writer.close
      exit!(0)
    end
    writer.close
    base, peak, after, lazy = reader.read.split.map(&:to_i)
    grown = peak - base
    # A fork inherits this test process's fiber pool: after earlier tests'
    # fibers its stacks may already be resident, and the child reuses them.
    skip "the forked child reused resident fiber stacks from earlier tests" if grown.zero?
    assert_operator grown, :>, 800 * 4096, "800 fibers touched at least a page of stack each"
    if after - base <= grown / 2 then "returned"
    elsif lazy >= grown / 2 then "lazy"
    else "kept"
    end
  ensure
    reader&.close
    Process.wait(pid) if pid
  end

  def test_fiber_stack_release_matches_an_independent_measurement
    check = doctor["fiber.stack_release"]
    assert_equal measure_fiber_stack_release, check.value
    assert_equal(check.value == "kept" ? :warn : :ok, check.status)
  end

  def test_max_map_count_advice_uses_the_measured_mappings_per_fiber
    per = doctor["fiber.stack_size"].value["address_space_per_fiber"]
    assert_operator per, :>, 0
    assert_match(/each live fiber adds \d+(\.\d+)? \(stack and guard page\)/, doctor["vm.max_map_count"].advice)
  end

  def test_cli_json_and_text
    out, err, status = memkit("doctor", "--json", "--no-probe")
    assert_includes [0, 1], status.exitstatus, err
    json = JSON.parse(out)
    names = json.fetch("checks").map { |c| c.fetch("name") }
    assert_includes names, "vm.max_map_count"
    assert_includes names, "transparent_hugepage"
    json["checks"].each { |c| assert_equal %w[advice name status value], c.keys.sort }
    max_map_count = json["checks"].find { |c| c["name"] == "vm.max_map_count" }
    assert_equal File.read("/proc/sys/vm/max_map_count").to_i, max_map_count["value"]
    assert_equal(json["checks"].any? { |c| c["status"] == "fail" } ? 1 : 0, status.exitstatus)

    out, _err, _status = memkit("doctor", Process.pid, "--no-probe")
    assert_match(/\Amemkit doctor: pid #{Process.pid}/, out)
    assert_match(/^\S+\s+transparent_hugepage\s+\w+/, out)
  end

  def test_cli_errors
    _out, err, status = memkit("doctor", "999999999")
    assert_equal 1, status.exitstatus
    assert_equal 1, err.lines.size
    assert_match(/no such process: pid 999999999/, err)
    _out, err, status = memkit("doctor", "nope")
    assert_equal 2, status.exitstatus
    assert_match(/not a pid/, err)
    assert_raises(Memkit::InvalidArgument) { Memkit::Doctor.new(fibers: 0) }
    assert_raises(Memkit::InvalidArgument) { Memkit::Doctor.new(timeout: 0) }
    _out, err, status = memkit("doctor", "--timeout", "-1")
    assert_equal 2, status.exitstatus
    assert_match(/--timeout/, err)
  end

  def test_a_kernel_thread_is_named_as_one_not_as_a_missing_process
    stat = File.read("/proc/2/stat")
    skip "pid 2 is not kthreadd here (a pid namespace: #{stat[/\(.*\)/]})" unless stat.include?("(kthreadd)")

    error = assert_raises(Memkit::KernelThread) { Memkit::Doctor.new(pid: 2).checks }
    assert_match(/pid 2 \(kthreadd\) is a kernel thread/, error.message)
    _out, err, status = memkit("doctor", "2")
    assert_equal 1, status.exitstatus
    assert_equal ["memkit: pid 2 (kthreadd) is a kernel thread: it has no user memory to diagnose\n"], err.lines
  end

  # Runs a stand-in probe with this source through Doctor::ProbeRunner.
  def run_probe(dir, name, source, timeout:)
    script = File.join(dir, name)
    File.write(script, source)
    Memkit::Doctor::ProbeRunner.new(ruby: RbConfig.ruby, env: { "PATH" => ENV.fetch("PATH") }, args: [dir],
                                    timeout: timeout, script: script).call
  end

  def alive?(pid)
    File.read("/proc/#{pid}/stat").split[2] != "Z"
  rescue SystemCallError
    false
  end

  def test_the_probe_is_killed_with_its_children_when_the_timeout_passes
    Dir.mktmpdir do |dir|
      threads = Thread.list.size
      # Forks like the real probe, says who it and its child are, and would
      # outlive any test run. 5 s: on a loaded machine (three lanes on two
      # cores) a Ruby took more than 0.5 s to boot and fork.
      result = run_probe(dir, "slow.rb", <<~RUBY, timeout: 5)
        child = fork { sleep 600 }
        File.write(File.join(ARGV[0], "pids"), [Process.pid, child].join(" "))
        sleep 600
      RUBY
      assert result[:timed_out]
      assert_equal "the probe did not finish within 5s and was stopped", result[:skipped]
      assert_equal threads, Thread.list.size, "the runner starts no threads"
      pids = File.read(File.join(dir, "pids")).split.map(&:to_i)
      assert_equal 2, pids.size
      wait_until(timeout: 5, message: "the probe and its fork child to be gone") { pids.none? { |pid| alive?(pid) } }
    end
  end

  def test_a_probe_that_fails_or_prints_nonsense_is_reported_not_raised
    Dir.mktmpdir do |dir|
      result = run_probe(dir, "failing.rb", "$stdout.puts '{'\nraise 'the probe broke'\n", timeout: 30)
      assert_match(/the probe failed: .*the probe broke/, result[:skipped])
      result = run_probe(dir, "nonsense.rb", "puts 'not json'\n", timeout: 30)
      assert_match(/the probe failed/, result[:skipped])
      assert_equal({ ok: [1] }, run_probe(dir, "fine.rb", "puts '{\"ok\": [1]}'\n", timeout: 30))
    end
  end

  def test_a_short_timeout_skips_the_probes_checks_quietly
    out, err, status = memkit("doctor", "--timeout", "0.05")
    assert_equal 0, status.exitstatus, err
    assert_empty err, "no thread traces or warnings"
    assert_match(/the probe did not finish within 0.05s and was stopped/, out)
    refute_match(/fiber.stack_release/, out)
  end

  def test_the_probe_file_is_plain_ruby_that_does_nothing_when_required
    _out, err, status = Open3.capture3(RbConfig.ruby, "-c", Memkit::Doctor::ProbeRunner::SCRIPT)
    assert status.success?, err
    script = "require #{Memkit::Doctor::ProbeRunner::SCRIPT.dump}; print :quiet"
    out, err, status = Open3.capture3(RbConfig.ruby, "-e", script)
    assert status.success?, err
    assert_equal "quiet", out
  end

  # A worker with one thread of its own, and memkit's: one thread, as far
  # as glibc's arenas go; a thread of the app's own counts.
  def test_memkit_does_not_count_its_malloc_release_thread
    skip "no malloc_trim in this process" unless Memkit::Libc.malloc_trim?
    skip "MALLOC_ARENA_MAX is set for the tests" if ENV["MALLOC_ARENA_MAX"]

    # A pid's count may add Ruby 3.3+'s timer thread, there with either.
    remote = ["Memkit::MallocRelease.start", "Thread.new { sleep }"].map do |extra|
      code = "require 'memkit'; #{extra}; puts :ready; $stdout.flush; sleep"
      Open3.popen2({ "MALLOC_ARENA_MAX" => nil }, RbConfig.ruby, "-I#{ROOT}/lib", "-e", code) do |stdin, out, wait|
        stdin.close
        out.gets
        threads(Memkit::Doctor.new(pid: wait.pid, probe: false)["MALLOC_ARENA_MAX"].advice)
      ensure
        Process.kill(:KILL, wait.pid)
      end
    end
    assert_equal remote[1] - 1, remote[0], "memkit's thread against one of the app's"
    assert_equal 1, threads(own_advice_with_malloc_release), "this process's own count"
  end

  def test_without_a_pid_memkit_does_not_count_its_probes_threads
    out, err, status = Open3.capture3({ "MALLOC_ARENA_MAX" => nil }, RbConfig.ruby, Memkit::TestHelpers::EXE,
                                      "doctor", "--json")
    assert_includes [0, 1], status.exitstatus, err
    check = JSON.parse(out).fetch("checks").find { |c| c["name"] == "MALLOC_ARENA_MAX" }
    refute_equal "warn", check.fetch("status"), check.fetch("advice")
    assert_match(/one thread/, check.fetch("advice"))
  end

  private

  def threads(advice) = advice[/one thread/] ? 1 : Integer(advice[/with (\d+) threads/, 1])

  # The advice in a child of this process that started MallocRelease.
  def own_advice_with_malloc_release
    r, w = IO.pipe
    pid = fork do
      r.close
      Memkit::MallocRelease.start
      w.write(Memkit::Doctor.new(probe: false)["MALLOC_ARENA_MAX"].advice)
      exit!(0)
    end
    w.close
    advice = r.read
    Process.wait(pid)
    advice
  ensure
    r&.close
  end
end
