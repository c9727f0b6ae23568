# frozen_string_literal: true

# How the master prepares for fork, shared by unicorn.rb and puma.rb.
module BenchRails
  module Modes
    # The warm-up requests: one of each kind of page the bench sends, with
    # ids the bench never uses (the workers' own requests stay cold).
    WARMUP_REQUESTS = ["/products", "/products?page=90&locale=fr", "/products/1999", "/products/1998?locale=fr",
                       "/categories/books", "/categories/music?locale=fr", "/api/products?page=95",
                       "/api/products.json?page=96&locale=fr"].freeze

    module_function

    def parse(spec)
      name, *flags = spec.split("+")
      { name: name, fill: (true if flags.include?("fill")) || (false if flags.include?("nofill")) }
    end

    def at_config(mode)
      case mode[:name]
      when "nakayoshi" then require "nakayoshi_fork"
      when "fork" then require "memkit/fork"
      when "plain", "process_warmup", "memkit", "heap" then nil
      else raise ArgumentError, "unknown COW_MEMKIT #{mode[:name].inspect}"
      end
      require "memkit"
    end

    def before_fork(mode, app)
      options = mode[:fill].nil? ? {} : { fill: mode[:fill] }
      case mode[:name]
      when "process_warmup" then Process.warmup
      when "memkit"
        report = Memkit.warmup(app: app, requests: WARMUP_REQUESTS, **options)
        warn "memkit warmup: #{report.requests.size} requests, #{report.failures.size} failed" unless report.requests.empty?
      when "heap" then Memkit.warmup(**options)
      end
    end
  end
end
