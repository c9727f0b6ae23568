# frozen_string_literal: true

require "test_helper"
require "net/http"
require "memkit/metrics"

class MetricsServerTest < Minitest::Test
  APP = ->(_env) { [200, { "content-type" => Memkit::Metrics::CONTENT_TYPE }, ["memkit_target_up 1\n"]] }

  def with_server(**options)
    ticks = Queue.new
    server = Memkit::Metrics::Server.new(APP, port: 0, tick: 0.05, on_tick: -> { ticks << 1 }, **options).start
    thread = Thread.new { server.run }
    yield server, ticks
  ensure
    server&.stop
    thread&.join(5)
  end

  def test_serves_metrics_and_nothing_else
    with_server do |server, ticks|
      assert_match(%r{\Ahttp://127\.0\.0\.1:\d+/metrics\z}, server.url)
      http = Net::HTTP.new("127.0.0.1", server.port)
      response = http.get("/metrics?x=1")
      assert_equal ["200", "memkit_target_up 1\n"], [response.code, response.body]
      assert_match(/\Atext\/plain; version=0\.0\.4/, response["content-type"])
      assert_equal "404", http.get("/other").code
      assert_equal "200", http.get("/").code
      assert_equal "405", http.post("/metrics", "").code
      head = http.head("/metrics")
      assert_equal ["200", nil], [head.code, head.body]
      Timeout.timeout(5) { ticks.pop }
    end
  end

  # A client that connects and says nothing is dropped after read_timeout;
  # the next scrape is answered.
  def test_a_silent_client_does_not_hold_it
    with_server(read_timeout: 0.2) do |server, _|
      silent = TCPSocket.new("127.0.0.1", server.port)
      assert_equal "200", Net::HTTP.new("127.0.0.1", server.port).tap { |h| h.read_timeout = 2 }.get("/metrics").code
      silent.close
    end
  end

  def test_bad_options_and_a_taken_port
    assert_raises(Memkit::InvalidArgument) { Memkit::Metrics::Server.new(APP, port: "9394") }
    assert_raises(Memkit::InvalidArgument) { Memkit::Metrics::Server.new(APP, port: 70_000) }
    with_server do |server, _|
      error = assert_raises(Memkit::Error) { Memkit::Metrics::Server.new(APP, port: server.port).start }
      assert_match(/cannot listen on 127\.0\.0\.1:#{server.port}/, error.message)
    end
  end
end
