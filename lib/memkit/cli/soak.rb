# frozen_string_literal: true

module Memkit
  class CLI
    # memkit soak TARGET: serve many requests, sample memory, fit bytes per
    # request after warm-up, and say leak, plateau or inconclusive.
    class Soak < Command
      BANNER = "config.ru|http://127.0.0.1:PORT/path [--pid PID] [--requests N] [--sample-every K] " \
               "[--warmup N] [--json] [--csv FILE] [--plot FILE.svg|.html] [--compare 'NAME:VAR=VALUE ...']"

      DEFAULT_MIN_LEAK = Memkit::Soak::Runner::DEFAULT_MIN_LEAK.to_i

      def call(argv)
        options[:compare] = []
        parse(argv, BANNER) do |o|
          o.on("--requests N", Integer, "requests to serve (default #{Memkit::Soak::Runner::DEFAULT_REQUESTS})") do |v|
            options[:requests] = v
          end
          o.on("--sample-every K", Integer, "requests between samples (default: requests / 200)") do |v|
            options[:sample_every] = v
          end
          o.on("--warmup N", Integer, "requests before the fit starts (default: a fifth of --requests)") do |v|
            options[:warmup] = v
          end
          o.on("--pid PID", "the server to sample, with its workers (URL targets)") { |v| options[:pid] = v }
          o.on("--concurrency C", Integer, "keep-alive connections in parallel (URL targets, default 4)") do |v|
            options[:concurrency] = v
          end
          o.on("--path PATH", "PATH_INFO and query for a config.ru target (default /)") { |v| options[:path] = v }
          o.on("--min-leak BYTES", Float,
               "slowest growth per request called a leak (default #{DEFAULT_MIN_LEAK})") do |v|
            options[:min_leak] = v
          end
          o.on("--[no-]gc", "full GC before each sample, config.ru targets (default on)") { |v| options[:gc] = v }
          o.on("--[no-]attribute",
               "trace the allocation sites that retain objects, config.ru targets (default on)") do |v|
            options[:attribute] = v
          end
          json_option(o)
          o.on("--csv FILE", "write the samples as CSV") { |v| options[:csv] = v }
          o.on("--plot FILE", "write the curve as .svg, or as a self-contained .html report") { |v| options[:plot] = v }
          o.on("--compare SPEC", "also run under NAME:VAR=VALUE ... and overlay the curves (repeatable)") do |v|
            options[:compare] << v
          end
          o.on("--fail-on-leak", "exit 3 when the verdict is leak (for CI)") { options[:fail_on_leak] = true }
        end
        raise UsageError, "missing TARGET: a config.ru or an http://127.0.0.1:PORT/ URL" if argv.empty?
        raise UsageError, "unexpected argument #{argv[1].inspect}" if argv.size > 1

        target = argv.first
        check_outputs
        specs = options[:compare].map { |c| translated { Memkit::Soak::Compare.parse(c) } }
        if specs.any? && Memkit::Soak.url?(target)
          raise UsageError, "--compare needs a config.ru target: a running server's environment cannot be changed"
        end

        results = [translated { run(target) }]
        results += specs.map do |spec|
          err.puts "memkit soak: running #{spec.name} (#{spec.env.map { |k, v| "#{k}=#{v}" }.join(' ')})" if err.tty?
          translated { Memkit::Soak::Compare.run(spec, target, **soak_options) }
        end
        results.first.label = "default" if specs.any?
        write_files(results)
        options[:json] ? print_json(json(results)) : out.puts(text(results))
        options[:fail_on_leak] && results.first.verdict.verdict == "leak" ? 3 : 0
      end

      private

      # Memkit::Soak.run's keyword for each option; the library's messages
      # name keywords ("requests: must be ..."), the user typed flags.
      FLAGS = { requests: "--requests", sample_every: "--sample-every", warmup: "--warmup", pid: "--pid",
                concurrency: "--concurrency", path: "--path", min_leak: "--min-leak", gc_budget: "--[no-]gc" }.freeze
      KEYWORD = /\b(#{FLAGS.keys.join('|')}):(?=[\s),.]|\z)/.freeze

      def run(target)
        kw = options.slice(:pid, :concurrency).merge(soak_options)
        Memkit::Soak.run(target, **kw, progress: options[:json] ? nil : err)
      end

      # The options a comparison run repeats: everything but the URL ones.
      def soak_options
        kw = options.slice(:requests, :sample_every, :warmup, :path, :min_leak, :attribute)
        kw[:gc_budget] = options[:gc] ? 1.0 : 0.0 unless options[:gc].nil?
        kw
      end

      # Re-raises a library error with keyword names turned into the flags.
      def translated
        yield
      rescue Memkit::Error => e
        message = e.message.gsub(KEYWORD) { FLAGS.fetch(Regexp.last_match(1).to_sym) }
        message = message.sub(/\Acomparison /, "--compare ")
        raise e if message == e.message

        raise e.class, message
      end

      def check_outputs
        if (plot = options[:plot]) && !plot.match?(/\.(svg|html?)\z/i)
          raise UsageError, "--plot #{plot}: the file name must end in .svg or .html"
        end
        options.slice(:csv, :plot).each { |opt, path| Memkit::Soak::AtomicFile.check!(path, "--#{opt}") }
      end

      def write_files(results)
        if (path = options[:csv])
          csv = results.map(&:to_csv)
          if results.size > 1
            csv = results.each_with_index.map { |r, i| run_column(r.to_csv, Memkit::Soak::Chart.label(r, i), i.zero?) }
          end
          Memkit::Soak::AtomicFile.write(path, csv.join)
        end
        return unless (path = options[:plot])

        title = "memkit soak #{File.basename(results.first.target)}"
        chart = Memkit::Soak::Chart
        content = path.match?(/\.svg\z/i) ? chart.svg(results, title: title) : chart.html(results, title: title)
        Memkit::Soak::AtomicFile.write(path, content)
      end

      def run_column(csv, label, header)
        lines = csv.lines
        head = "run,#{lines.shift}"
        (header ? [head] : []).concat(lines.map { |l| "#{label},#{l}" }).join
      end

      def gc_note(result)
        result.gc_seconds >= 0.05 ? ", #{result.gc_seconds.round(1)} s of it in forced GCs" : ""
      end

      def json(results)
        main = results.first.to_h
        main[:compare] = results.drop(1).map(&:to_h) if results.size > 1
        main
      end

      def text(results)
        r = results.first
        lines = ["memkit soak #{r.target}: #{r.requests} requests in #{r.seconds.round(1)} s " \
                 "(#{r.requests_per_second} req/s#{gc_note(r)}), " \
                 "rss sampled every #{r.sample_every}, fit after #{r.warmup}"]
        lines << Memkit::Soak::TerminalPlot.render(results)
        results.each_with_index do |res, i|
          prefix = results.size > 1 ? "#{Memkit::Soak::Chart.label(res, i)}: " : ""
          ci = res.confidence ? " (95% CI #{res.confidence.join('..')})" : ""
          lines << "#{prefix}verdict: #{res.verdict.verdict}: #{res.verdict.reason}"
          of = res.metric == "live" ? "live memory (heap slots + malloc, after GC)" : "rss"
          lines << "#{prefix}bytes_per_request: #{res.bytes_per_request}#{ci} of #{of}, " \
                   "final rss #{human(res.samples.last.rss)}"
          extra = []
          heap = res.fits[:heap_live_bytes]
          malloc = res.fits[:malloc_bytes]
          extra << "ruby heap slots #{heap.slope.round(1)} B/request" if heap
          extra << "malloc #{malloc.slope.round(1)} B/request (#{res.malloc_source})" if malloc
          lines << "#{prefix}#{extra.join(', ')}" unless extra.empty?
          lines << "#{prefix}#{res.http_errors} responses were 5xx" if res.http_errors&.positive?
        end
        sites = Array(r.attribution)
        unless sites.empty?
          lines << "objects still alive from a traced window of requests, by allocation site:"
          rows = sites.map { |s| [s.site, s.class_name, s.count, human(s.bytes)] }
          lines << CLI.table(%w[site class objects bytes], rows, left: [0, 1])
        end
        lines << "wrote #{[options[:csv], options[:plot]].compact.join(' and ')}" if options[:csv] || options[:plot]
        lines.join("\n")
      end
    end
  end
end
