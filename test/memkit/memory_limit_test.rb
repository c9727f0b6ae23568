# frozen_string_literal: true

require "test_helper"
require_relative "servers_helper"

class MemoryLimitTest < Minitest::Test
  include Memkit::ServersHelper

  def app(**options) = Memkit::MemoryLimit.new(->(_env) { [200, {}, ["ok"]] }, **options)

  def test_options_are_checked_at_construction
    assert_raises(Memkit::InvalidArgument) { app }
    error = assert_raises(Memkit::InvalidArgument) { app(max_uss: "3XB") }
    assert_match(/max_uss/, error.message)
    assert_raises(Memkit::InvalidArgument) { app(max_uss: 0) }
    assert_raises(Memkit::InvalidArgument) { app(max_requests: -1) }
    assert_raises(Memkit::InvalidArgument) { app(max_uss: "1GB", jitter: 2) }
    assert_raises(Memkit::InvalidArgument) { app(max_uss: "1GB", replace: :NOSUCHSIG) }
    assert_raises(Memkit::Error) { app(max_uss: "1GB", check_every: 0) }
    assert_equal 300 * 1024 * 1024, app(max_uss: "300MB").max_uss
  end

  # Outside a known server nothing is signalled; a callable gets the reason.
  def test_max_requests_with_jitter_calls_replace_once
    reasons = []
    middleware = Memkit::MemoryLimit.new(->(_env) { [200, {}, ["ok"]] }, max_requests: 100, jitter: 0.2,
                                         replace: ->(why) { reasons << why }, logger: StringIO.new)
    150.times do
      env = { "rack.after_reply" => [] }
      middleware.call(env)
      env["rack.after_reply"].each(&:call)
    end
    limit = middleware.limits[:max_requests]
    assert_includes 80..100, limit
    assert_equal 1, reasons.size
    assert_match(/served #{limit} requests/, reasons.first)
  end

  def test_under_an_unknown_server_it_logs_and_does_not_signal
    log = StringIO.new
    middleware = Memkit::MemoryLimit.new(->(_env) { [200, {}, ["ok"]] }, max_uss: 1, jitter: 0, logger: log)
    _, _, body = middleware.call({ "SERVER_SOFTWARE" => "WEBrick" })
    body.close # no after_reply hook: the body's close is the signal
    assert_match(/uss .* > limit 1 B .*not restarting it: unknown server/, log.string)
  end

  LEAKY_APP = <<~RUBY
    require "memkit"
    LEAK = []
    use Memkit::MemoryLimit, max_uss: ENV.fetch("MAX_USS"), jitter: 0.2
    run lambda { |env|
      # 2 MiB that stay: the worker's USS grows with every request.
      LEAK << ("x" * (2 << 20)) unless env["PATH_INFO"] == "/ping"
      [200, { "content-type" => "text/plain" }, [Process.pid.to_s]]
    }
  RUBY

  def test_puma_cluster_replaces_bloated_workers_without_failed_requests
    recycle_under(:puma)
  end

  def test_unicorn_replaces_bloated_workers_without_failed_requests
    recycle_under(:unicorn)
  end

  private

  # Several keep-alive clients hammer a leaking app until the workers have
  # been replaced at least 5 times; every request must get a 2xx response.
  def recycle_under(kind)
    Dir.mktmpdir("memkit-limit") do |dir|
      server = start_server(kind, LEAKY_APP, dir: dir, port: free_port, threads: 2,
                                             env: { "MAX_USS" => "90MB" }, check_path: "/ping")
      begin
        pids = Queue.new
        failures = Queue.new
        clients = Array.new(4) { Memkit::ServersHelper::KeepAliveClient.new(server.port) }
        seen = {}
        stop = false
        served = 0
        threads = clients.map do |client|
          Thread.new do
            until stop
              begin
                pids << client.get("/leak")[2].to_i
                served += 1
              rescue Memkit::ServersHelper::KeepAliveClient::Failure, SystemCallError, IOError => e
                failures << "#{e.class}: #{e.message}"
              end
            end
          end
        end
        wanted = Integer(ENV.fetch("MEMKIT_RECYCLES", "5"))
        wait_until(timeout: 20 + 5 * wanted, interval: 0.1, message: "#{wanted} worker replacements under #{kind}") do
          seen[pids.pop] = true until pids.empty?
          seen.size >= 2 + wanted
        end
        stop = true
        threads.each(&:join)
        seen[pids.pop] = true until pids.empty?
        log = server.log_text
        replaced = log.scan(/memkit: worker \d+ uss .* asking #{kind} to replace it \(SIG#{kind == :puma ? 'TERM' : 'QUIT'}\)/i)
        errors = failures.size.times.map { failures.pop }
        stats = clients.map { |c| [c.connections, c.stale_reconnects, c.retries_after_send] }
        assert_empty errors, "failed requests under #{kind} (#{served} served):\n#{errors.first(5).join("\n")}"
        assert_operator seen.size - 2, :>=, 5, "worker pids seen: #{seen.size}"
        assert_operator replaced.size, :>=, 5, "replacement log lines:\n#{log[-2000..]}"
        puts "\n#{kind}: #{served} requests, #{seen.size} worker pids, #{replaced.size} replacements logged; per client " \
             "[connections, stale keep-alive reconnects, retries after send]: #{stats.inspect}"
      ensure
        clients&.each(&:close)
        stop_server(server)
      end
    end
  end
end
