# frozen_string_literal: true

require_relative "../memkit"
require_relative "soak/fit"
require_relative "soak/verdict"
require_relative "soak/malloc_stats"
require_relative "soak/sampler"
require_relative "soak/sample_log"
require_relative "soak/rack_driver"
require_relative "soak/url_driver"
require_relative "soak/attribution"
require_relative "soak/result"
require_relative "soak/progress"
require_relative "soak/chart"
require_relative "soak/terminal_plot"
require_relative "soak/compare"
require_relative "soak/atomic_file"
require_relative "soak/runner"

module Memkit
  # Memory growth over many requests: drive an app, sample its memory every
  # K requests, fit bytes per request after warm-up and call it a leak, a
  # plateau or inconclusive.
  #
  #   result = Memkit::Soak.run("config.ru", requests: 20_000)
  #   result.verdict.verdict    # => "leak"
  #   result.verdict.reason     # => "grows 400 B/request (95% CI 400..400), ..."
  #   result.bytes_per_request  # => 400.0
  #
  # TARGET is a Rack config.ru (driven in this process, no network) or an
  # http://127.0.0.1:PORT/path URL together with pid: of the server, whose
  # whole process tree is sampled. See docs/SOAK.md.
  module Soak
    module_function

    # Options are those of Memkit::Soak::Runner#initialize; invalid ones raise
    # Memkit::InvalidArgument before anything runs.
    def run(target, **options, &on_sample)
      Runner.new(target, **options).run(&on_sample)
    end

    def url?(target) = target.to_s.match?(%r{\Ahttps?://}i)
  end
end
