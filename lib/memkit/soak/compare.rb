# frozen_string_literal: true

require "json"
require "open3"
require "rbconfig"

module Memkit
  module Soak
    # Runs the same soak again in a new Ruby process under another
    # environment ("jemalloc:LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
    # "arena2:MALLOC_ARENA_MAX=2"), so the curves can be overlaid. A child
    # process is the only way: LD_PRELOAD and glibc's MALLOC_* tunables are
    # read once, when the process starts. The child loads this library and
    # calls Compare.child, which runs Memkit::Soak.run with the same keyword
    # options and prints the Result as JSON: no CLI in between.
    module Compare
      Spec = Struct.new(:name, :env, keyword_init: true)
      LIB = File.expand_path("../..", __dir__)
      # Keywords of Soak.run a comparison passes on (progress and pid are not:
      # nobody watches the child's terminal, and URL targets cannot compare).
      OPTIONS = %i[requests sample_every warmup path min_leak gc_budget attribute].freeze

      module_function

      # text: "NAME:VAR=VALUE [VAR=VALUE ...]".
      def parse(text)
        name, assignments = text.to_s.split(":", 2)
        unless name && !name.strip.empty? && assignments
          raise InvalidArgument, "comparison #{text.inspect}: expected NAME:VAR=VALUE [VAR=VALUE ...]"
        end

        env = assignments.split.to_h do |pair|
          var, value = pair.split("=", 2)
          unless value && var.match?(/\A[A-Za-z_]\w*\z/)
            raise InvalidArgument, "comparison #{name}: #{pair.inspect} is not VAR=VALUE"
          end

          [var, value]
        end
        raise InvalidArgument, "comparison #{name}: no VAR=VALUE given" if env.empty?

        # The dynamic loader only warns about a missing preload and runs
        # without it, which would compare glibc with itself.
        env.fetch("LD_PRELOAD", "").split(/[: ]/).reject(&:empty?).each do |lib|
          raise InvalidArgument, "comparison #{name}: LD_PRELOAD library not found: #{lib}" unless File.exist?(lib)
        end
        Spec.new(name: name.strip, env: env)
      end

      # The soak of target with options (Soak.run's keywords), in a child
      # process under spec.env; a Result labelled with spec.name.
      def run(spec, target, **options)
        unknown = options.keys - OPTIONS
        raise InvalidArgument, "comparison #{spec.name}: cannot pass #{unknown.join(', ')}" if unknown.any?

        out, err, status = Open3.capture3(spec.env, RbConfig.ruby, "-I", LIB, "-rmemkit", "-e",
                                          "Memkit::Soak::Compare.child", target.to_s, JSON.generate(options))
        answer = JSON.parse(out) unless out.empty?
        if answer.nil? || answer["error"] || !status.success?
          why = answer&.fetch("error", nil) || err.lines.last&.strip || "exit #{status.exitstatus}"
          raise Error, "comparison #{spec.name}: #{why}"
        end

        Result.from_h(answer).tap { |r| r.label = spec.name }
      rescue JSON::ParserError => e
        raise Error, "comparison #{spec.name}: unreadable output from the child run (#{e.message[0, 60]})"
      end

      # The child's side: ARGV is the target and the options as JSON. Prints
      # the Result's JSON, or {"error": message} and exits 1.
      def child(argv = ARGV, out: $stdout)
        target, json = argv
        options = JSON.parse(json, symbolize_names: true)
        out.print JSON.generate(Soak.run(target, **options).to_h)
      rescue Memkit::Error => e
        out.print JSON.generate(error: e.message)
        exit 1
      end
    end
  end
end
