# frozen_string_literal: true

require "json"
require "open3"
require "rbconfig"

module Memkit
  module Soak
    # Runs the same soak again in a fresh `memkit soak` process under another
    # environment ("jemalloc:LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
    # "arena2:MALLOC_ARENA_MAX=2"), so the curves can be overlaid. A child
    # process is the only way: LD_PRELOAD and glibc's MALLOC_* tunables are
    # read once, when the process starts.
    module Compare
      Spec = Struct.new(:name, :env, keyword_init: true)
      EXE = File.expand_path("../../../exe/memkit", __dir__)

      module_function

      def parse(text)
        name, assignments = text.to_s.split(":", 2)
        unless name && !name.strip.empty? && assignments
          raise InvalidArgument, "--compare #{text.inspect}: expected NAME:VAR=VALUE [VAR=VALUE ...]"
        end

        env = assignments.split.to_h do |pair|
          var, value = pair.split("=", 2)
          raise InvalidArgument, "--compare #{name}: #{pair.inspect} is not VAR=VALUE" unless value && var.match?(/\A[A-Za-z_]\w*\z/)

          [var, value]
        end
        raise InvalidArgument, "--compare #{name}: no VAR=VALUE given" if env.empty?

        # The dynamic loader only warns about a missing preload and runs
        # without it, which would compare glibc with itself.
        env.fetch("LD_PRELOAD", "").split(/[: ]/).reject(&:empty?).each do |lib|
          raise InvalidArgument, "--compare #{name}: LD_PRELOAD library not found: #{lib}" unless File.exist?(lib)
        end
        Spec.new(name: name.strip, env: env)
      end

      # args: the soak options as CLI arguments (without --json or --compare).
      def run(spec, target, args)
        out, err, status = Open3.capture3(spec.env, RbConfig.ruby, EXE, "soak", target, *args, "--json")
        unless status.success?
          raise Error, "--compare #{spec.name}: #{err.lines.last&.strip || "exit #{status.exitstatus}"}"
        end

        Result.from_h(JSON.parse(out)).tap { |r| r.label = spec.name }
      rescue JSON::ParserError => e
        raise Error, "--compare #{spec.name}: unreadable output from the child run (#{e.message[0, 60]})"
      end
    end
  end
end
