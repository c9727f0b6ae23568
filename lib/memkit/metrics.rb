# frozen_string_literal: true

module Memkit
  # Prometheus text exposition of a server's memory, as a Rack app:
  #
  #   map("/metrics") { run Memkit::Metrics.new }
  #
  # Per process (labels pid and role, "master" for the root, "worker" below
  # it): rss, pss, uss, shared, private_dirty and swap, all in bytes; tree
  # totals (pss is the figure to alert on: rss summed over workers counts
  # shared pages once per worker); and, for the process that answers the
  # scrape, Ruby's GC counters and Memkit::OobGC's if it is in use.
  #
  # `memkit metrics --pid MASTER` serves the same text from a separate
  # process, for servers whose app cannot mount it.
  class Metrics
    CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

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

    # root: a pid, or :auto -- the parent when it runs the same executable as
    #   this process (a Unicorn or Puma worker under its master), else this
    #   process.
    # gc: include this process's GC counters.
    def initialize(root: :auto, gc: true)
      raise InvalidArgument, "Memkit::Metrics: root must be :auto or a pid (got #{root.inspect})" unless root == :auto || root.is_a?(Integer) && root.positive?

      @root = root
      @gc = gc
    end

    def call(env)
      return [405, { "content-type" => "text/plain", "allow" => "GET, HEAD" }, ["GET only\n"]] unless %w[GET HEAD].include?(env["REQUEST_METHOD"])

      text = Metrics.render(root_pid, gc: @gc)
      [200, { "content-type" => CONTENT_TYPE, "content-length" => text.bytesize.to_s },
       [env["REQUEST_METHOD"] == "HEAD" ? "" : text]]
    end

    def root_pid
      return @root unless @root == :auto

      ppid = Process.ppid
      same = ppid > 1 && File.readlink("/proc/#{ppid}/exe") == File.readlink("/proc/self/exe")
      same ? ppid : Process.pid
    rescue SystemCallError
      Process.pid
    end

    class << self
      # The exposition for the tree under `pid`. A tree that cannot be read
      # (the master exited, permissions) gives memkit_up 0 and the reason as a
      # comment, not an error: Prometheus keeps scraping and can alert on it.
      def render(pid, gc: false)
        out = +""
        begin
          tree = Memkit.tree(pid)
        rescue Error => e
          gauge(out, "memkit_up", "1 if the process tree could be read, else 0.", [[{}, 0]])
          out << "# memkit: #{e.message.tr("\n", ' ')}\n"
          gc_metrics(out) if gc
          return out
        end
        gauge(out, "memkit_up", "1 if the process tree could be read, else 0.", [[{}, 1]])
        PROCESS.each do |field, help|
          rows = tree.nodes.map { |n| [{ pid: n.pid, role: n.depth.zero? ? "master" : "worker" }, n.memory.public_send(field)] }
          gauge(out, "memkit_process_#{field}_bytes", help, rows)
        end
        TREE.each do |field, help|
          gauge(out, "memkit_tree_#{field}_bytes", help, [[{ pid: tree.pid }, tree.public_send("total_#{field}")]])
        end
        gauge(out, "memkit_tree_processes", "Processes in the tree: the root and its descendants.", [[{ pid: tree.pid }, tree.nodes.size]])
        gc_metrics(out) if gc
        out
      end

      private

      def gc_metrics(out)
        pid = { pid: Process.pid }
        stat = GC.stat
        counter(out, "memkit_gc_runs_total", "GC runs in the process that answered this scrape.",
                [[pid.merge(kind: "minor"), stat[:minor_gc_count]], [pid.merge(kind: "major"), stat[:major_gc_count]]])
        counter(out, "memkit_gc_time_seconds_total", "Time spent in GC by the process that answered this scrape.",
                [[pid, stat[:time].to_i / 1000.0]]) if stat.key?(:time)
        gauge(out, "memkit_gc_heap_live_slots", "Live object slots in the Ruby heap.", [[pid, stat[:heap_live_slots]]])
        gauge(out, "memkit_gc_heap_free_slots", "Free object slots in the Ruby heap.", [[pid, stat[:heap_free_slots]]])
        # Only when the app uses OobGC: autoload? is nil once it is loaded.
        return if Memkit.autoload?(:OobGC)

        s = OobGC.stats
        counter(out, "memkit_oobgc_requests_total", "Requests seen by Memkit::OobGC.", [[pid, s.requests]])
        counter(out, "memkit_oobgc_runs_total", "GC runs Memkit::OobGC started between requests.",
                [[pid.merge(kind: "minor"), s.oob_minor], [pid.merge(kind: "major"), s.oob_major]])
        counter(out, "memkit_oobgc_inside_request_runs_total", "GC runs that still happened while a request was being served.",
                [[pid.merge(kind: "minor"), s.inside_minor], [pid.merge(kind: "major"), s.inside_major]])
        counter(out, "memkit_oobgc_time_seconds_total", "Time spent in GC runs started by Memkit::OobGC.", [[pid, s.oob_seconds]])
        counter(out, "memkit_oobgc_watched_runs_total", "GC runs left to Ruby while a new worker's heap settled.",
                [[pid, s.watched]])
      end

      def gauge(out, name, help, rows) = family(out, name, "gauge", help, rows)
      def counter(out, name, help, rows) = family(out, name, "counter", help, rows)

      def family(out, name, type, help, rows)
        out << "# HELP #{name} #{help}\n# TYPE #{name} #{type}\n"
        rows.each do |labels, value|
          out << name
          unless labels.empty?
            out << "{" << labels.map { |k, v| "#{k}=\"#{escape(v)}\"" }.join(",") << "}"
          end
          out << " " << format_value(value) << "\n"
        end
      end

      def escape(value) = value.to_s.gsub("\\", "\\\\\\\\").gsub("\"", "\\\"").gsub("\n", "\\n")

      def format_value(value)
        value.is_a?(Float) ? format("%.6f", value) : value.to_i.to_s
      end
    end
  end
end
