# frozen_string_literal: true

module Memkit
  class CLI
    # memkit doctor [PID]: the settings and limits that decide a Ruby server's
    # memory, each with its measured value, ok/warn/fail and one line of advice.
    # Exits 1 when a check fails, so it can gate a deploy.
    class Doctor < Command
      MARKS = { ok: "ok", warn: "WARN", fail: "FAIL" }.freeze

      def call(argv)
        parse(argv, "[PID] [--json] [--no-probe] [--fibers N] [--timeout SECONDS]") do |o|
          json_option(o)
          o.on("--no-probe", "skip the checks that start a Ruby probe (fiber stacks, GC after fork)") do
            options[:probe] = false
          end
          o.on("--fibers N", Integer, "fibers the probe creates (default 1000)") { |n| options[:fibers] = n }
          o.on("--timeout SECONDS", Float, "stop the probe after this long (default 60)") { |s| options[:timeout] = s }
        end
        raise UsageError, "unexpected argument #{argv[1].inspect}" if argv.size > 1

        pid = argv.empty? ? nil : pid_argument(argv)
        raise UsageError, "--fibers: must be a positive number" unless options.fetch(:fibers, 1).positive?
        raise UsageError, "--timeout: must be a positive number of seconds" unless options.fetch(:timeout, 1).positive?

        doctor = Memkit::Doctor.new(pid: pid, **options.slice(:probe, :fibers, :timeout))
        checks = doctor.checks
        if options[:json]
          print_json(doctor.to_h)
        else
          out.puts "memkit doctor: pid #{pid || Process.pid}#{pid ? '' : ' (this Ruby)'}"
          rows = checks.map { |c| [MARKS.fetch(c.status), c.name, format_value(c.value)] }
          out.puts CLI.table(%w[status check value], rows, left: [0, 1, 2])
          out.puts
          checks.each { |c| out.puts "#{MARKS.fetch(c.status).ljust(4)} #{c.name}: #{c.advice}" }
        end
        checks.any? { |c| c.status == :fail } ? 1 : 0
      end

      private

      def format_value(value)
        case value
        when nil then "-"
        when Hash then value.map { |k, v| "#{k}=#{v.nil? ? '-' : v}" }.join(" ")[0, 80]
        else value.to_s[0, 80]
        end
      end
    end
  end
end
