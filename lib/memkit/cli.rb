# frozen_string_literal: true

require "optparse"
require "json"
require_relative "../memkit"

module Memkit
  # `memkit COMMAND ...`. run(argv) returns the exit status: 0 ok, 1 runtime
  # failure, 2 usage error. Errors print one line; --debug adds the backtrace.
  class CLI
    class UsageError < Error; end

    # Each command lives in lib/memkit/cli/NAME.rb and is loaded on use, so
    # `memkit stat` does not pay for loading a web server.
    COMMANDS = {
      "stat" => "one process: rss, pss, uss, shared, private, swap",
      "smaps" => "memstat-style summary of /proc/PID/smaps with the shared percentage",
      "tree" => "a process and its descendants: per-process memory and true totals",
      "maps" => "memory by kind of mapping: heap, anonymous, stacks, libraries, files",
      "cow" => "each worker's sharing with its master (copy-on-write decay)",
      "metrics" => "Prometheus exporter for a server tree",
      "soak" => "memory growth over many requests: leak or plateau",
      "doctor" => "check the runtime's memory settings and limits",
      "bench" => "benchmarks: cow, fiber",
      "demo" => "boot a sample app on Unicorn with 4 workers and report its memory"
    }.freeze

    attr_reader :out, :err

    def initialize(out: $stdout, err: $stderr)
      @out = out
      @err = err
    end

    def run(argv)
      argv = argv.dup
      @debug = argv.delete("--debug")
      name = argv.shift
      case name
      when nil then err.puts(help) || 2
      when "-h", "--help", "help" then out.puts(help) || 0
      when "-v", "--version" then out.puts("memkit #{VERSION}") || 0
      else catch(:done) { command(name).new(self, name).call(argv) || 0 }
      end
    rescue UsageError, OptionParser::ParseError, InvalidArgument => e
      failure(e, 2, usage: name)
    rescue Error => e
      failure(e, 1)
    rescue Interrupt
      130
    rescue Errno::EPIPE
      0 # `memkit tree 1 | head`: the reader left, which is not an error
    end

    def help
      width = COMMANDS.keys.map(&:size).max
      lines = COMMANDS.map { |cmd, text| format("  %-#{width}s  %s", cmd, text) }
      ["Usage: memkit COMMAND [options]   (memkit COMMAND --help for its options)", "", *lines, "",
       "Global options: --debug (show backtraces), --version, --help"].join("\n")
    end

    private

    def command(name)
      raise UsageError, "unknown command #{name.inspect} (memkit --help lists them)" unless COMMANDS.key?(name)

      require_relative "cli/#{name}"
      CLI.const_get(name.capitalize)
    end

    def failure(error, status, usage: nil)
      message = error.message.lines.first.to_s.chomp
      message += " (see memkit #{usage} --help)" if status == 2 && COMMANDS.key?(usage.to_s)
      err.puts "memkit: #{message}"
      err.puts(error.full_message(highlight: false)) if @debug
      status
    end

    # Base for commands: option parsing, output and pid arguments.
    class Command
      def initialize(cli, name)
        @cli = cli
        @name = name
        @options = {}
      end

      def out = @cli.out
      def err = @cli.err

      private

      attr_reader :options

      def parse(argv, banner)
        parser = OptionParser.new do |o|
          o.banner = "Usage: memkit #{@name} #{banner}"
          yield o if block_given?
          o.on("-h", "--help", "show this help") { out.puts(o.help) || throw(:done, 0) }
        end
        parser.parse!(argv)
      end

      def json_option(o) = o.on("--json", "print JSON (sizes in bytes)") { options[:json] = true }

      def watch_option(o)
        o.on("--watch SECONDS", Float, "redraw every SECONDS until Ctrl-C") do |seconds|
          raise UsageError, "--watch needs a positive number of seconds" unless seconds.positive?

          options[:watch] = seconds
        end
      end

      # Runs the block once, or with --watch again every SECONDS until Ctrl-C,
      # which is how watching is meant to end (exit status 0).
      def repeat
        return yield unless options[:watch]

        loop do
          out.print "\e[H\e[2J" if out.tty? && !options[:json]
          yield
          out.flush
          sleep options[:watch]
        end
      rescue Interrupt
        0
      end

      def pid_argument(argv)
        raise UsageError, "missing PID" if argv.empty?
        raise UsageError, "unexpected argument #{argv[1].inspect}" if argv.size > 1

        ProcFS.pid!(argv.first)
      end

      def print_json(object) = out.puts(JSON.pretty_generate(object))

      def human(bytes) = Units.human(bytes)
    end

    # Text from another process (a command line, a comm) made safe for a
    # terminal and a table: control characters are shown as escapes ("\n",
    # "\t", "\e", "\x7f", "\u009b"), so a process named with a newline cannot
    # break a row and one named with ANSI codes cannot colour the terminal.
    # Bidirectional overrides are escaped too: they reorder what follows.
    CONTROL = {
      "\n" => "\\n", "\t" => "\\t", "\r" => "\\r", "\e" => "\\e", "\\" => "\\\\"
    }.freeze

    def self.printable(text)
      text = text.to_s
      text = text.encoding == Encoding::BINARY ? text.dup.force_encoding(Encoding::UTF_8) : text.encode(Encoding::UTF_8)
      text.scrub.gsub(/[\\\p{Cc}\u202a-\u202e\u2066-\u2069]/) do |c|
        CONTROL.fetch(c) { c.ord < 0x80 ? format("\\x%02x", c.ord) : format("\\u%04x", c.ord) }
      end
    rescue EncodingError
      printable(text.b)
    end

    # A table: columns right-aligned except those named in left:.
    def self.table(headers, rows, left: [])
      cells = [headers, *rows].map { |r| r.map(&:to_s) }
      widths = headers.each_index.map { |i| cells.map { |r| r[i].size }.max }
      cells.map do |r|
        r.each_with_index.map { |c, i| left.include?(i) ? c.ljust(widths[i]) : c.rjust(widths[i]) }.join("  ").rstrip
      end.join("\n")
    end
  end
end
