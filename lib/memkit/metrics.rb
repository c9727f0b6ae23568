# frozen_string_literal: true

require_relative "../memkit"
require_relative "allocator"
require_relative "cgroup"
require_relative "metrics/exposition"
require_relative "metrics/title"
require_relative "metrics/store"
require_relative "metrics/recorder"

module Memkit
  # Prometheus text exposition of a forking server's memory, as a Rack app:
  #
  #   use Memkit::Metrics::Recorder                 # every worker's GC/OobGC counters
  #   map("/metrics") { run Memkit::Metrics.new }
  #
  # and, in the server's config, the hook that names each worker's index
  # (Unicorn: after_fork { |_, w| Memkit::Metrics.worker_booted(w.nr) }; see
  # docs/METRICS.md for Puma and Pitchfork).
  #
  # Per process, labelled role (master, mold, worker, child) and worker (the
  # server's worker index, which a replacement inherits, so a replaced
  # worker's series continue instead of piling up): rss, pss, uss, shared,
  # private_dirty and swap; the allocator it has mapped and its arena
  # settings; GC and OobGC counters from every worker. For the tree: totals
  # (pss is the figure to alert on), and each worker's sharing with the
  # master. memkit_target_up is 0, with the reason as a comment, when the
  # tree cannot be read.
  #
  # `memkit metrics --pid MASTER` serves the same page from outside the
  # server (Memkit::Metrics::Server).
  class Metrics
    CONTENT_TYPE = Exposition::CONTENT_TYPE

    # Only an exporter outside the server needs it.
    autoload :Server, File.expand_path("metrics/server", __dir__)

    PROCESS = {
      rss: "Resident set size: every resident page, shared ones included.",
      pss: "Proportional set size: each shared page divided among the processes sharing it.",
      uss: "Unique set size: private pages, what exiting would free.",
      shared: "Resident pages shared with another process (clean and dirty).",
      private_dirty: "Private pages written since fork or mapping (copy-on-write copies, heap).",
      swap: "Swapped-out pages of this process."
    }.freeze

    TREE = {
      rss: "Sum of rss over the tree; counts shared pages once per process.",
      pss: "Sum of pss over the tree: its real memory footprint.",
      uss: "Sum of uss over the tree: memory only one process uses.",
      swap: "Sum of swap over the tree."
    }.freeze

    # The server hook's call, in each new worker: see Recorder.boot.
    def self.worker_booted(index, **options) = Recorder.boot(index, **options)

    # The server hook's call in a new Pitchfork mold.
    def self.mold_booted(**options) = Recorder.boot(nil, role: :mold, **options)

    attr_reader :root

    # root: the master's pid, or :auto: the master found through the server
    #   (the worker hook's, else the process titles, see Title.master, else
    #   the process that built this app when it is an ancestor of the one
    #   answering: a preloading master), never a wrapper above it.
    # gc: report this process's own GC counters when it keeps no record.
    # dir: the Store directory of the workers' records (default: per master).
    # container: :auto reads the memory cgroup of the tree's root
    #   (Memkit::Cgroup; nothing is exported where there is none), or a
    #   callable returning {limit:, usage:} in bytes (either may be nil), or
    #   nil for none.
    # logger: gets one line when the tree goes away (and when it is back).
    def initialize(root: :auto, gc: true, dir: nil, container: :auto, logger: nil)
      unless root == :auto || (root.is_a?(Integer) && root.positive?)
        raise InvalidArgument, "Memkit::Metrics: root must be :auto or a pid (got #{root.inspect})"
      end
      if container && container != :auto && !container.respond_to?(:call)
        raise InvalidArgument, "Memkit::Metrics container: expected a callable, got #{container.inspect}"
      end

      @root = root
      @gc = gc
      @dir = dir
      @container = container
      @logger = logger
      @built_in = Process.pid
      @up = nil
      @lock = Mutex.new
    end

    def call(env)
      unless %w[GET HEAD].include?(env["REQUEST_METHOD"])
        return [405, { "content-type" => "text/plain", "allow" => "GET, HEAD" }, ["GET only\n"]]
      end

      text = render
      [200, { "content-type" => CONTENT_TYPE, "content-length" => text.bytesize.to_s },
       [env["REQUEST_METHOD"] == "HEAD" ? "" : text]]
    end

    # The exposition, and memkit_target_up's transitions logged once each.
    def render
      Recorder.record(force: true, dir: @dir) if Recorder.active?
      pid = root_pid
      text, error = Metrics.render_tree(pid, gc: @gc, dir: @dir, container: @container)
      up!(error.nil?, pid, error)
      text
    end

    # Whether the tree is still there, logging the change if not; for an
    # exporter that wants to say so before the next scrape.
    def check
      pid = root_pid
      alive = File.exist?("/proc/#{pid}/stat")
      up!(alive, pid, alive ? nil : "no such process: pid #{pid}")
      alive
    end

    def root_pid
      return @root unless @root == :auto

      id = Recorder.active? ? Recorder.identity : nil
      return id.master if id

      master = Title.master(Process.pid)
      return master if master != Process.pid
      # A server whose titles memkit does not know: a preloading master built
      # this app, then forked the process answering.
      return @built_in if @built_in != Process.pid && ancestor?(@built_in)

      Process.pid
    rescue Error
      Process.pid
    end

    private

    def ancestor?(pid)
      current = Process.ppid
      16.times do
        return true if current == pid
        return false if current <= 1

        current = Status.read(current).ppid
      end
      false
    end

    def up!(up, pid, error)
      @lock.synchronize do
        return if @up == up || (@up.nil? && up)

        @up = up
        line = up ? "pid #{pid} is back" : "#{error}; serving memkit_target_up 0"
        @logger&.puts("memkit metrics: #{line}")
      end
    end

    class << self
      # The exposition for the tree under `pid`, as a String.
      def render(pid, **options) = render_tree(pid, **options).first

      # [text, error message or nil]. A tree that cannot be read (the master
      # exited, permissions) gives memkit_target_up 0 and the reason as a
      # comment, not an exception: Prometheus keeps scraping and can alert.
      def render_tree(pid, gc: false, dir: nil, container: nil)
        out = Exposition.new
        begin
          tree = Memkit.tree(pid)
        rescue Error => e
          out.gauge("memkit_target_up", "1 if the watched process tree could be read, else 0.", [[{}, 0]])
          out.comment("memkit: #{e.message}")
          return [out.to_s, e.message]
        end
        out.gauge("memkit_target_up", "1 if the watched process tree could be read, else 0.", [[{}, 1]])
        records = Store.new(dir || Store.default_dir(tree.pid)).read
        procs = label(tree, records)
        process_families(out, procs)
        tree_families(out, tree, procs, container == :auto ? cgroup_of(tree.pid) : container)
        allocator_family(out, procs)
        own = procs.find { |p| p.node.pid == Process.pid }
        if gc && own && !records.key?(Process.pid)
          records = records.merge(Process.pid => Counters.read)
        end
        counter_families(out, procs, records)
        [out.to_s, nil]
      end

      Labelled = Struct.new(:node, :role, :worker, :labels)

      private

      # Each node's role and worker index: the record its worker wrote, else
      # its title; the root is the master. The first process to claim a
      # (role, worker) pair gets it as its labels; any other (a worker still
      # exiting while its successor boots, a child) also gets its pid, so no
      # two series ever share a label set.
      def label(tree, records)
        taken = {}
        tree.nodes.map do |node|
          record = records[node.pid]
          role, worker =
            if node.depth.zero? then ["master", nil]
            elsif record then [record[:role].to_s, record[:worker]]
            else
              r, i = Title.parse(node.command)
              [(r || :child).to_s, i]
            end
          labels = { role: role }
          labels[:worker] = worker.to_s if worker
          labels[:pid] = node.pid.to_s if role == "child" || taken[labels]
          taken[labels] = true
          Labelled.new(node, role, worker, labels)
        end
      end

      def process_families(out, procs)
        PROCESS.each do |field, help|
          out.gauge("memkit_process_#{field}_bytes", help,
                    procs.map { |p| [p.labels, p.node.memory.public_send(field)] })
        end
        out.gauge("memkit_process_info", "1 per process, naming its pid and command line.",
                  procs.map { |p| [p.labels.merge(pid: p.node.pid, command: p.node.command), 1] })
      end

      def tree_families(out, tree, procs, container)
        TREE.each do |field, help|
          out.gauge("memkit_tree_#{field}_bytes", help, [[{}, tree.public_send("total_#{field}")]])
        end
        out.gauge("memkit_tree_processes", "Processes in the tree: the master and its descendants.",
                  [[{}, tree.nodes.size]])
        master_rss = tree.root.memory.rss
        out.gauge("memkit_worker_shared_with_master_ratio",
                  "A worker's shared pages over the master's rss: how much of the master it still shares " \
                  "(copy-on-write efficiency; estimate, as memkit cow without pagemap).",
                  procs.select { |p| p.role == "worker" && master_rss.positive? }
                       .map { |p| [p.labels, p.node.memory.shared.fdiv(master_rss)] })
        container_families(out, container)
      end

      # The root's memory cgroup as the container reading, or nil where it
      # has none (not Linux, no memory controller) or it cannot be read.
      def cgroup_of(pid)
        lambda do
          reading = Cgroup.read(pid)
          { limit: reading.limit, usage: reading.usage }
        rescue Error
          nil
        end
      end

      def container_families(out, container)
        return unless container

        reading = container.call or return
        helps = { limit: "The container's memory limit.", usage: "The container's memory usage, page cache included." }
        helps.each do |key, help|
          value = reading[key]
          out.gauge("memkit_container_memory_#{key}_bytes", help, [[{}, value]]) if value
        end
      end

      def allocator_family(out, procs)
        rows = procs.filter_map do |p|
          a = Allocator.read(p.node.pid)
          arena = a.environ_readable ? a.arena_max.to_s : "unknown"
          conf = a.environ_readable ? a.malloc_conf.to_s : "unknown"
          [p.labels.merge(allocator: a.name, arena_max: arena, malloc_conf: conf), 1]
        rescue Error
          nil # exited since the tree was read, or hidden from this user
        end
        out.gauge("memkit_allocator_info",
                  "1 per process, naming the malloc it has mapped (glibc unless jemalloc, tcmalloc or mimalloc is) " \
                  "and its arena settings at exec (arena_max \"\" = unset; \"unknown\" = environ unreadable).", rows)
      end

      COUNTERS = [
        ["memkit_gc_runs_total", "GC runs, per process.", { gc_minor: { kind: "minor" }, gc_major: { kind: "major" } }],
        ["memkit_gc_time_seconds_total", "Time spent in GC, per process.", { gc_time_ms: {} }],
        ["memkit_oobgc_requests_total", "Requests seen by Memkit::OobGC.", { oobgc_requests: {} }],
        ["memkit_oobgc_runs_total", "GC runs Memkit::OobGC started between requests.",
         { oobgc_minor: { kind: "minor" }, oobgc_major: { kind: "major" } }],
        ["memkit_oobgc_inside_request_runs_total", "GC runs that still happened while a request was being served.",
         { oobgc_inside_minor: { kind: "minor" }, oobgc_inside_major: { kind: "major" } }],
        ["memkit_oobgc_time_seconds_total", "Time spent in GC runs started by Memkit::OobGC.", { oobgc_seconds: {} }],
        ["memkit_oobgc_watched_runs_total",
         "GC runs inside requests while OobGC had given up (see OobGC.stats.gave_up).",
         { oobgc_watched: {} }]
      ].freeze

      GAUGES = [
        ["memkit_gc_heap_live_slots", "Live object slots in the Ruby heap.", :heap_live_slots],
        ["memkit_gc_heap_free_slots", "Free object slots in the Ruby heap.", :heap_free_slots]
      ].freeze

      # Every process's counters from its record (this process's own, read
      # live, when it keeps none): one scrape reports the whole server.
      def counter_families(out, procs, records)
        with = procs.filter_map { |p| (r = records[p.node.pid]) && [p, r] }
        COUNTERS.each do |name, help, keys|
          rows = with.flat_map do |p, r|
            keys.filter_map do |key, extra|
              next unless r.key?(key)

              value = key == :gc_time_ms ? r[key] / 1000.0 : r[key]
              [p.labels.merge(extra), value]
            end
          end
          out.counter(name, help, rows)
        end
        GAUGES.each do |name, help, key|
          out.gauge(name, help, with.filter_map { |p, r| [p.labels, r[key]] if r.key?(key) })
        end
        limit_keys = with.flat_map { |_, r| r.keys.grep(/\Amemory_limit_/) }.uniq.sort
        limit_keys.each do |key|
          what = key.to_s.delete_prefix("memory_limit_")
          out.counter("memkit_#{key}_total", "Memkit::MemoryLimit's #{what} counter.",
                      with.filter_map { |p, r| [p.labels, r[key]] if r.key?(key) })
        end
      end
    end
  end
end
