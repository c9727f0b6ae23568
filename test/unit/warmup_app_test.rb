# frozen_string_literal: true

require "test_helper"
require "stringio"
require "logger"

# Memkit.warmup(app:, requests:): the app's requests run in this process,
# once each, before the heap steps; failures are reported and logged, and
# forking still works.
class WarmupAppTest < Minitest::Test
  # A Rack app that records every env it sees and hands out bodies that
  # remember being iterated and closed.
  class Recorder
    Body = Struct.new(:chunks, :closed, :iterated) do
      def each(&block)
        self.iterated = true
        chunks.each(&block)
      end

      def close = self.closed = true
    end

    attr_reader :calls, :bodies

    def initialize(&responder)
      @calls = []
      @bodies = []
      @responder = responder
    end

    def call(env)
      @calls << env
      status = @responder ? @responder.call(env) : 200
      body = Body.new(["ok #{env['PATH_INFO']}"], false, false)
      @bodies << body
      [status, { "content-type" => "text/plain" }, body]
    end
  end

  def setup
    Memkit::Warmup.reset!
  end

  def test_runs_each_request_once_before_the_heap_steps_and_closes_every_body
    gc_at_call = nil
    app = Recorder.new do
      gc_at_call ||= GC.count
      200
    end
    gc_before = GC.count
    report = Memkit.warmup(app: app, requests: ["/products", "/api/products.json?page=2",
                                                { "REQUEST_METHOD" => "POST", "PATH_INFO" => "/search",
                                                  "rack.input" => "q=x", "CONTENT_TYPE" => "text/plain" }])
    refute report.skipped
    assert_equal gc_before, gc_at_call, "requests run before the heap preparation's GCs"
    assert report.gc_runs >= 1
    assert_equal %w[/products /api/products.json /search], app.calls.map { |e| e["PATH_INFO"] }
    assert_equal ["", "page=2", ""], app.calls.map { |e| e["QUERY_STRING"] }
    assert_equal %w[GET GET POST], app.calls.map { |e| e["REQUEST_METHOD"] }
    assert_equal "q=x", app.calls.last["rack.input"].read
    assert app.bodies.all?(&:closed), "every response body is closed"
    assert app.bodies.all?(&:iterated), "every response body is rendered"
    assert_equal [200, 200, 200], report.requests.map(&:status)
    assert_empty report.failures
    assert_equal 3, report.to_h[:requests].size

    again = Memkit.warmup(app: app, requests: ["/products"], force: true)
    assert_equal 3, app.calls.size, "a second call with the same app (before the next worker's fork) sends nothing"
    assert_empty again.requests
  end

  def test_builds_an_env_rack_lint_accepts
    skip "rack is not installed in this lane" unless rack_lint?

    app = Recorder.new
    requests = ["/a?b=c", { "PATH_INFO" => "/d", "HTTP_ACCEPT" => "text/html" }]
    report = Memkit.warmup(app: Rack::Lint.new(app), requests: requests)
    assert_empty report.failures, report.to_h[:requests].inspect
    env = app.calls.first
    %w[SERVER_NAME SERVER_PORT SERVER_PROTOCOL rack.input rack.errors rack.url_scheme HTTP_HOST].each do |key|
      assert env.key?(key), "env has #{key}"
    end
    assert_equal "text/html", app.calls.last["HTTP_ACCEPT"]
  end

  def test_failures_are_reported_and_logged_once_each_and_the_rest_still_run
    app = Recorder.new do |env|
      raise ArgumentError, "boom" if env["PATH_INFO"] == "/raises"

      env["PATH_INFO"] == "/broken" ? 503 : 200
    end
    log = StringIO.new
    report = Memkit.warmup(app: app, requests: ["/raises", "/broken", "/fine"], logger: Logger.new(log))
    assert_equal %w[/raises /broken /fine], app.calls.map { |e| e["PATH_INFO"] }
    assert_equal %w[/raises /broken], report.failures.map(&:path)
    assert_nil report.failures.first.status
    assert_match(/ArgumentError: boom/, report.failures.first.error)
    assert_equal 503, report.failures.last.status
    lines = log.string.lines
    assert_equal 2, lines.size, log.string
    assert_match(%r{GET /raises raised ArgumentError: boom}, lines[0])
    assert_match(%r{GET /broken answered 503}, lines[1])
    assert_equal 2, app.bodies.size
    assert app.bodies.all?(&:closed)
    refute report.skipped, "the heap is still prepared"
  end

  def test_without_a_logger_the_line_goes_to_stderr_and_an_io_logger_gets_puts
    app = Recorder.new { 500 }
    _out, err = capture_io { Memkit.warmup(app: app, requests: ["/x"]) }
    assert_equal 1, err.lines.size
    assert_match(%r{memkit warmup: GET /x answered 500}, err)

    io = StringIO.new
    Memkit.warmup(app: Recorder.new { 500 }, requests: ["/y"], logger: io)
    assert_match(%r{GET /y answered 500}, io.string)
  end

  def test_a_failing_warmup_still_forks_and_the_child_sees_the_report
    app = Recorder.new { raise "down" }
    report = nil
    capture_io { report = Memkit.warmup(app: app, requests: ["/"]) }
    assert_equal 1, report.failures.size
    r, w = IO.pipe
    pid = fork do
      r.close
      w.write(Memkit::Warmup.last_report.failures.map(&:path).join(","))
      w.close
      exit!(0)
    end
    w.close
    assert_equal "/", r.read
    _, status = Process.wait2(pid)
    assert status.success?
  end

  def test_body_closed_when_iterating_raises
    body = Struct.new(:closed) do
      def each = raise(IOError, "stream broke")

      def close = self.closed = true
    end.new(false)
    app = ->(_env) { [200, {}, body] }
    report = nil
    capture_io { report = Memkit.warmup(app: app, requests: ["/stream"]) }
    assert body.closed
    assert_match(/IOError: stream broke/, report.failures.first.error)
  end

  def test_invalid_app_and_requests_raise_invalid_argument
    assert_raises(Memkit::InvalidArgument) { Memkit.warmup(app: Object.new, requests: ["/"]) }
    assert_raises(Memkit::InvalidArgument) { Memkit.warmup(app: Recorder.new, requests: "/") }
    assert_raises(Memkit::InvalidArgument) { Memkit.warmup(app: Recorder.new, requests: ["products"]) }
    assert_raises(Memkit::InvalidArgument) { Memkit.warmup(requests: ["/"]) }
  end

  def test_app_without_requests_gets_the_root_path
    app = Recorder.new
    Memkit.warmup(app: app)
    assert_equal ["/"], app.calls.map { |e| e["PATH_INFO"] }
  end

  def test_each_result_carries_what_the_request_allocated
    app = ->(_env) { [200, {}, [Array.new(500) { Object.new }.size.to_s + ("x" * 100_000)]] }
    # A sweep an earlier GC left lazy frees garbage's malloc'd memory during
    # the requests, which lowers the counter (76,480 bytes seen on 3.1).
    GC.start(immediate_sweep: true)
    results = Memkit::Warmup::App.new(app, %w[/a /b /c]).run
    results.each do |r|
      assert_operator r.objects, :>=, 500, "the 500 objects the app made: #{r.to_h}"
      next if r.malloc_bytes.nil? # a GC ran during it and reset the counter

      assert_operator r.malloc_bytes, :>=, 100_000, "the 100 KB string: #{r.to_h}"
    end
  end

  def test_allocation_profile_is_the_median_request_after_the_first
    result = lambda do |objects, malloc, status = 200|
      Memkit::Warmup::App::Result.new(status: status, objects: objects, malloc_bytes: malloc)
    end
    profile = Memkit::Warmup::App.allocation_profile(
      [result.(90_000, 9_000_000), result.(10, 300), result.(12, 200), result.(11, nil), result.(5_000, 1, 500)]
    )
    assert_equal({ objects: 11, malloc_bytes: 300 }, profile,
                 "the first (compiling) request and the failed one are left out; a nil malloc reading is skipped")
    assert_nil Memkit::Warmup::App.allocation_profile([result.(10, 300)]), "one request cannot tell typical from first"
    assert_nil Memkit::Warmup::App.allocation_profile([result.(10, 300), result.(10, nil)]),
               "no malloc reading without a GC in between"
  end

  private

  def rack_lint?
    require "rack"
    require "rack/lint"
    true
  rescue LoadError
    false
  end

end
