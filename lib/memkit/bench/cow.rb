# frozen_string_literal: true

require "json"
require "optparse"
require "rbconfig"
require_relative "../../memkit"
require_relative "../cow"

module Memkit
  module Bench
    # memkit bench cow: copy-on-write after fork, every way of preparing for
    # it side by side in one run, on two heap shapes:
    #   tree: seed 000's shape, a binary tree of empty arrays (2^(depth+1) objects)
    #   app:  lib/memkit/bench/cow_app.rb, a booted web app's heap, each child serving requests
    # Each row is a fresh master process: it builds the shape, prepares as
    # its mode says, forks N children that wait until all are forked, then
    # each runs its work and a full GC. This process then measures every
    # child from outside (smaps_rollup, pagemap frames). The headline is
    # what the tree costs: the total PSS of master + children, and each
    # child's USS; shared% of the master is secondary, beside the master's rss.
    class Cow
      RUBY_MODES = {
        "plain" => "fork with nothing done before",
        "nakayoshi" => "the nakayoshi_fork gem (up to 4 minor GCs before every fork)",
        "puma_old" => "Puma's old nakayoshi_fork option: 4 minor GCs + GC.compact once",
        "process_warmup" => "Process.warmup once (Ruby 3.3+)",
        "warmup" => "Memkit.warmup once before forking (memkit's default)",
        "warmup_fill" => "Memkit.warmup(fill: true) once before forking",
        "memkit_fork" => "require \"memkit/fork\" (adaptive hook on every fork)",
        "floor" => "brute force: 10 full GCs, GC.compact, full GC, malloc_trim (the floor)"
      }.freeze
      STEP_MODES = {
        "step:promote" => { process_warmup: false, coderange: false, compact: false, trim: false, fill: false },
        "step:+coderange" => { process_warmup: false, compact: false, trim: false, fill: false },
        "step:+compact" => { process_warmup: false, trim: false, fill: false },
        "step:+trim" => { process_warmup: false, fill: false },
        "step:+fill" => { process_warmup: false, fill: true }
      }.freeze
      ANCHORS = %w[nakayoshi process_warmup puma_old].freeze

      def self.run(argv, out: $stdout)
        bench = new(argv, out)
        bench.help? ? 0 : bench.run
      end

      def initialize(argv, out)
        @out = out
        @opts = { shapes: %w[tree app], children: 8, depth: 21, requests: 2000, scale: 1.0, python: true,
                  modes: default_modes, steps: false }
        OptionParser.new do |o|
          o.banner = "Usage: memkit bench cow [options]"
          o.on("--shape LIST", Array, "tree, app (default both)") { |v| @opts[:shapes] = v }
          o.on("--children N", Integer, "children per master (default 8)") { |v| @opts[:children] = v }
          o.on("--depth N", Integer, "tree depth: 2^(N+1) arrays (default 21)") { |v| @opts[:depth] = v }
          o.on("--requests N", Integer, "requests each app child serves (default 2000)") { |v| @opts[:requests] = v }
          o.on("--scale X", Float, "app shape scale, 1 = ~120 MB (default 1)") { |v| @opts[:scale] = v }
          o.on("--modes LIST", Array, "subset of: #{(RUBY_MODES.keys + STEP_MODES.keys).join(', ')}") do |v|
            @opts[:modes] = v
          end
          o.on("--steps", "add Memkit.warmup step by step (promote, +coderange, +compact, +trim)") do
            @opts[:steps] = true
          end
          o.on("--[no-]python", "add the Python rows (gc.freeze vs not; default on when python3 exists)") do |v|
            @opts[:python] = v
          end
          o.on("-h", "--help", "print this help and exit") do
            @out.puts(o.help)
            @help = true
          end
        end.parse!(argv)
        return if @help

        unknown = @opts[:modes] - RUBY_MODES.keys - STEP_MODES.keys
        raise InvalidArgument, "unknown mode(s) #{unknown.join(', ')}" unless unknown.empty?
        raise InvalidArgument, "children must be >= 1, not #{@opts[:children]}" unless @opts[:children] >= 1
        if @opts[:modes].include?("process_warmup") && !Process.respond_to?(:warmup)
          raise InvalidArgument, "mode process_warmup needs Process.warmup (Ruby 3.3+)"
        end
        if @opts[:modes].include?("nakayoshi") && !nakayoshi_installed?
          raise InvalidArgument, "mode nakayoshi needs the nakayoshi_fork gem installed"
        end
      end

      def help? = @help ? true : false

      def default_modes
        modes = RUBY_MODES.keys
        modes -= ["process_warmup"] unless Process.respond_to?(:warmup)
        modes -= ["nakayoshi"] unless nakayoshi_installed?
        modes
      end

      # The nakayoshi_fork gem is an anchor, not a dependency: its row is
      # left out where it is not installed.
      def nakayoshi_installed?
        Gem::Specification.find_all_by_name("nakayoshi_fork").any?
      rescue StandardError
        false
      end

      def run
        modes = @opts[:modes] + (@opts[:steps] ? STEP_MODES.keys : [])
        @out.puts "memkit bench cow: ruby #{RUBY_VERSION}, #{@opts[:children]} children, " \
                  "#{File.read('/proc/sys/kernel/osrelease').strip rescue '?'}, nproc #{Etc.nprocessors}"
        rows = []
        @opts[:shapes].each do |shape|
          modes.each { |mode| rows << measure_ruby(shape, mode) }
          if @opts[:python] && shape == "tree" && system("python3 -c 1", out: File::NULL, err: File::NULL)
            [false, true].each { |freeze| rows << measure_python(freeze) }
          end
        end
        header = %w[shape mode tree_pss master_pss child_uss max_uss shared% master_rss prep_ms fork1_ms forkN_ms]
        @out.puts CLI.table(header, rows.map { |r| row(r) }, left: [0, 1])
        ratios(rows)
        @out.puts "tree_pss: total PSS of the master and its #{@opts[:children]} children after their work " \
                  "and a full GC " \
                  "(what the tree costs); child_uss: a child's private memory (mean, max); " \
                  "shared%: of the master's rss, secondary"
        0
      end

      private

      def row(r)
        uss = r[:children].map { |c| c[:uss] }
        [r[:shape], r[:mode], Units.human(r[:tree_pss]), Units.human(r[:master_pss]), Units.human(mean(uss)),
         Units.human(uss.max), format("%.1f", mean(r[:children].map { |c| c[:shared_pct] })),
         Units.human(r[:parent_rss]), ms(r[:prep]), ms(r[:forks].first), ms(mean(r[:forks].drop(1)))]
      end

      # Each mode's tree against plain fork and against the best anchor
      # (the smallest tree among the other tools' recipes) on this Ruby.
      def ratios(rows)
        @opts[:shapes].each do |shape|
          of_shape = rows.select { |r| r[:shape] == shape }
          plain = of_shape.find { |r| r[:mode] == "plain" }
          best = of_shape.select { |r| ANCHORS.include?(r[:mode]) }.min_by { |r| r[:tree_pss] }
          of_shape.each do |r|
            next if r.equal?(plain) || r.equal?(best)

            line = format("%-5s %-16s tree %s", shape, r[:mode], Units.human(r[:tree_pss]))
            line << format("  %.2fx plain", r[:tree_pss].fdiv(plain[:tree_pss])) if plain
            line << format("  %.2fx %s (best anchor)", r[:tree_pss].fdiv(best[:tree_pss]), best[:mode]) if best
            @out.puts line
          end
        end
      end

      def ms(seconds) = seconds ? format("%.1f", seconds * 1000) : "-"

      def mean(values) = values.empty? ? nil : values.sum.fdiv(values.size)

      def measure_ruby(shape, mode)
        args = ["-I", File.expand_path("../..", __dir__), "-r", "memkit/bench/cow", "-e",
                "Memkit::Bench::Cow::Master.new(*ARGV).run", shape, mode, @opts[:children].to_s,
                @opts[:depth].to_s, @opts[:requests].to_s, @opts[:scale].to_s]
        measure(shape, mode, [RbConfig.ruby, *args])
      end

      def measure_python(freeze)
        measure("tree", freeze ? "python gc.freeze()" : "python plain",
                ["python3", "-c", PYTHON, @opts[:depth].to_s, @opts[:children].to_s, freeze ? "1" : "0"])
      end

      # The master prints one JSON line when all its children are ready,
      # then waits for its stdin to close.
      def measure(shape, mode, command)
        IO.popen(command, "r+") do |io|
          line = io.gets or raise Error, "#{mode}: master exited early"
          info = JSON.parse(line, symbolize_names: true)
          cow = Memkit::Cow.read(info[:pid], info[:children])
          master = Memory.read(info[:pid])
          children = info[:children].map { |pid| Memory.read(pid) }
          { shape: shape, mode: mode, parent_rss: cow.master_rss, prep: info[:prep], forks: info[:forks],
            tree_pss: master.pss + children.sum(&:pss), master_pss: master.pss,
            children: cow.workers.zip(children).map do |w, m|
              { private_dirty: w.private_dirty, shared_pct: w.shared_pct, uss: m.uss }
            end }
        ensure
          io.close_write
        end
      end

      # The forking side, run in a fresh Ruby per row.
      class Master
        def initialize(shape, mode, children, depth, requests, scale)
          @shape = shape
          @mode = mode
          @children = Integer(children)
          @depth = Integer(depth)
          @requests = Integer(requests)
          @scale = Float(scale)
        end

        def run
          build
          prep = time { prepare }
          go_r, go_w = IO.pipe
          ready_r, ready_w = IO.pipe
          forks = []
          pids = Array.new(@children) do
            pid = nil
            forks << time { pid = fork { child(go_r, go_w, ready_r, ready_w) } }
            pid
          end
          go_r.close
          ready_w.close
          go_w.close # every child is forked: let them work
          ready_r.read(@children)
          $stdout.puts JSON.generate(pid: Process.pid, children: pids, prep: prep, forks: forks)
          $stdout.flush
          $stdin.read
        ensure
          pids&.each { |pid| Process.kill(:KILL, pid) rescue nil }
          pids&.each { |pid| Process.wait(pid) rescue nil }
        end

        private

        def time
          t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
          yield
          Process.clock_gettime(Process::CLOCK_MONOTONIC) - t
        end

        def build
          if @shape == "tree"
            @tree = make_tree(@depth) # the parent's heap the children share
          else
            require_relative "cow_app"
            CowApp.boot(scale: @scale)
          end
        end

        def make_tree(n) = n.positive? ? [make_tree(n - 1), make_tree(n - 1)] : []

        def prepare
          case @mode
          when "plain", "floor", "process_warmup", "puma_old", "warmup", "warmup_fill" then nil
          when "nakayoshi" then require "nakayoshi_fork"
          when "memkit_fork" then require "memkit/fork"
          when /\Astep:/ then Memkit.warmup(force: true, **STEP_MODES.fetch(@mode))
          else raise InvalidArgument, "unknown mode #{@mode}"
          end
          case @mode
          when "floor"
            10.times { GC.start(full_mark: true, immediate_sweep: true) }
            GC.compact if GC.respond_to?(:compact)
            GC.start
            Libc.malloc_trim
          when "process_warmup" then Process.warmup
          when "puma_old"
            4.times { GC.start(full_mark: false) }
            GC.compact if GC.respond_to?(:compact)
          when "warmup" then Memkit.warmup
          when "warmup_fill" then Memkit.warmup(fill: true)
          end
        end

        def child(go_r, go_w, ready_r, ready_w)
          go_w.close
          ready_r.close
          go_r.read # until the master closes it
          if @shape == "app"
            env = { "PATH_INFO" => "/", "REQUEST_METHOD" => "GET" }
            @requests.times { CowApp.call(env) }
          end
          GC.start(full_mark: true, immediate_sweep: true)
          sleep 1.5 # in every mode: MallocRelease's thread looks once a second
          ready_w.write("r")
          ready_w.close
          sleep
        end
      end

      PYTHON = <<~PY
        import gc, json, os, sys, time
        depth, children, freeze = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
        def make(n):
            return [make(n - 1), make(n - 1)] if n > 0 else []
        tree = make(depth)
        t = time.monotonic()
        if freeze:
            gc.collect()
            gc.freeze()
        prep = time.monotonic() - t
        go_r, go_w = os.pipe()
        ready_r, ready_w = os.pipe()
        pids, forks = [], []
        for _ in range(children):
            t = time.monotonic()
            pid = os.fork()
            if pid == 0:
                os.close(go_w); os.close(ready_r)
                os.read(go_r, 1)
                gc.collect()
                os.write(ready_w, b"r")
                time.sleep(3600)
                os._exit(0)
            forks.append(time.monotonic() - t)
            pids.append(pid)
        os.close(go_r); os.close(ready_w); os.close(go_w)
        got = 0
        while got < children:
            got += len(os.read(ready_r, children))
        print(json.dumps({"pid": os.getpid(), "children": pids, "prep": prep, "forks": forks}), flush=True)
        sys.stdin.read()
        for pid in pids:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
      PY
    end
  end
end
