# frozen_string_literal: true

require "rbconfig"

module Memkit
  # memkit's optional C extension (ext/memkit): FiberPool's core and the
  # soak driver's per-request check. Each has a Ruby version that is used
  # when this is not built (no compiler or Ruby headers where the gem was
  # installed), or when MEMKIT_NATIVE=0 is set: then nothing is loaded and
  # every part runs its Ruby version (to compare the two, or to rule C out).
  #
  # Built by `rake compile` or `gem install`, into a folder per Ruby ABI: next
  # to this file in a checkout; RubyGems also copies it there, but a gem's
  # extension folder on $LOAD_PATH is where it is built first.
  module Native
    path = "#{RbConfig::CONFIG.fetch("ruby_version")}/memkit_native"
    LOADED = ENV["MEMKIT_NATIVE"] != "0" && begin
      require_relative path
      true
    rescue LoadError
      begin
        require "memkit/#{path}"
        true
      rescue LoadError
        false
      end
    end
  end
end
