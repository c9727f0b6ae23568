# frozen_string_literal: true

require_relative "lib/memkit/version"

Gem::Specification.new do |spec|
  spec.name = "memkit"
  spec.version = Memkit::VERSION
  spec.authors = ["memkit developers"]
  spec.summary = "Make forking Ruby servers share more memory, and show where it goes"
  spec.description = "CoW-friendly fork, fast /proc memory statistics for whole server trees, " \
                     "out-of-band GC, memory limits, leak detection and Prometheus metrics " \
                     "for Unicorn, Puma, Pitchfork, Sidekiq and Resque."
  spec.license = "MIT"
  spec.required_ruby_version = ">= 3.1"

  spec.files = Dir["lib/**/*.rb", "lib/memkit/demo/*", "ext/**/*.{c,rb}", "exe/*",
                   "README.md", "CHANGELOG.md", "LICENSE", "docs/**/*"]
  spec.bindir = "exe"
  spec.executables = ["memkit"]
  spec.require_paths = ["lib"]
  spec.extensions = ["ext/memkit/extconf.rb"] # optional: FiberPool runs without it
  spec.metadata["rubygems_mfa_required"] = "true"
end
