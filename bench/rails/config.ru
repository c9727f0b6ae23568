# frozen_string_literal: true

# rackup file for the bench Rails app, loaded in the master (preload).
# BenchRails::Probe wraps the app for bench/cow_rails.rb:
#   every response carries x-worker: "PID COUNT" (requests this process's app served
#     since it was forked: a Puma worker reforked from worker 0 starts at 0 again);
#   a request with x-limit: N to a worker that already served N answers at once,
#     without the app, and slowly, so that the other workers take the next ones;
#   GET /gc runs a full GC in the worker that takes it, then holds it busy for
#     ?hold=SECONDS so concurrent /gc calls reach distinct workers.
require_relative "app"
Rails.application.initialize!

module BenchRails
  class Probe
    def initialize(app)
      @app = app
      @count = 0
      @pid = Process.pid
    end

    def call(env)
      if @pid != Process.pid # forked: a worker counts its own requests
        @pid = Process.pid
        @count = 0
      end
      return gc(env) if env["PATH_INFO"] == "/gc"

      limit = env["HTTP_X_LIMIT"]&.to_i
      if limit && @count >= limit
        sleep 0.02
        return [200, { "x-worker" => "#{Process.pid} #{@count}", "x-full" => "1" }, []]
      end

      status, headers, body = @app.call(env)
      @count += 1 unless env["memkit.warmup"]
      headers["x-worker"] = "#{Process.pid} #{@count}"
      [status, headers, body]
    end

    def gc(env)
      GC.start(full_mark: true, immediate_sweep: true)
      hold = env["QUERY_STRING"].to_s[/hold=([\d.]+)/, 1].to_f
      sleep(hold) if hold.positive?
      [200, { "x-worker" => "#{Process.pid} #{@count}" }, ["gc=#{GC.count}\n"]]
    end
  end
end

BENCH_RAILS_APP = BenchRails::Probe.new(Rails.application)
run BENCH_RAILS_APP
