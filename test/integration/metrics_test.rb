# frozen_string_literal: true

require "test_helper"
require "json"
require "net/http"
require "support/servers"

class MetricsTest < Minitest::Test
  include Memkit::ServersHelper

  APP = <<~RUBY
    require "memkit"
    use Memkit::OobGC
    map("/metrics") { run Memkit::Metrics.new }
    run ->(_env) { [200, { "content-type" => "text/plain" }, [Process.pid.to_s]] }
  RUBY

  def test_exposition_format
    text = Memkit::Metrics.render(Process.pid, gc: true)
    assert_match(/^# TYPE memkit_process_pss_bytes gauge$/, text)
    assert_match(/^memkit_process_pss_bytes\{pid="#{Process.pid}",role="master"\} \d+$/, text)
    assert_match(/^memkit_tree_pss_bytes\{pid="#{Process.pid}"\} \d+$/, text)
    assert_match(/^memkit_gc_runs_total\{pid="#{Process.pid}",kind="major"\} \d+$/, text)
    assert_match(/^memkit_up 1$/, text)
    text.each_line do |line|
      next if line.start_with?("#")

      assert_match(/\A[a-z_]+(\{[a-z_]+="[^"]*"(,[a-z_]+="[^"]*")*\})? -?\d+(\.\d+)?\n\z/, line)
    end
  end

  def test_a_tree_that_cannot_be_read_is_reported_as_down
    pid = spawn(RbConfig.ruby, "-e", "exit")
    Process.wait(pid)
    text = Memkit::Metrics.render(pid)
    assert_match(/^memkit_up 0$/, text)
    assert_match(/^# memkit: .*#{pid}/, text)
    _out, _err, status = memkit("metrics", "--pid", pid, "--once")
    assert_equal 1, status.exitstatus
  end

  def test_options
    assert_raises(Memkit::InvalidArgument) { Memkit::Metrics.new(root: "x") }
    _out, err, status = memkit("metrics")
    assert_equal 2, status.exitstatus
    assert_match(/--pid is required/, err)
    _out, err, status = memkit("metrics", "--pid", Process.pid, "--listen", "nohost:port")
    assert_equal 2, status.exitstatus, err
  end

  # A real Unicorn with 2 workers; `memkit metrics` exports its tree; the
  # in-app /metrics exports the same tree (its root is the master) plus GC
  # counters; promtool accepts both; a real Prometheus scrapes the exporter
  # and stores what `memkit tree --json` reports.
  def test_prometheus_scrapes_memkit_metrics
    skip "no /proc/PID/smaps_rollup" unless linux?
    %w[prometheus promtool].each { |tool| skip "#{tool} not installed (apt install prometheus)" unless system("command -v #{tool} >/dev/null") }

    Dir.mktmpdir("memkit-metrics") do |dir|
      server = start_server(:unicorn, APP, dir: dir, port: free_port)
      exporter = prometheus = nil
      begin
        workers = wait_until(timeout: 20, message: "2 unicorn workers") { (kids = children(server.pid)).size == 2 && kids }
        exporter_out = File.join(dir, "exporter.out")
        exporter = spawn(RbConfig.ruby, EXE, "metrics", "--pid", server.pid.to_s, "--listen", "127.0.0.1:0",
                         out: exporter_out, err: [:child, :out])
        port = wait_until(timeout: 20, message: "exporter address") { File.read(exporter_out)[%r{127\.0\.0\.1:(\d+)/metrics}, 1] }.to_i

        exported = http_get(port, "/metrics")
        assert_equal 0, promtool(exported), "promtool check metrics failed on:\n#{exported}"
        roles = exported.scan(/^memkit_process_rss_bytes\{pid="(\d+)",role="(\w+)"\}/).to_h { |pid, role| [pid.to_i, role] }
        assert_equal({ server.pid => "master", workers[0] => "worker", workers[1] => "worker" }, roles)
        assert_equal 404, Net::HTTP.get_response(URI("http://127.0.0.1:#{port}/nothing")).code.to_i

        in_app = http_get(server.port, "/metrics")
        assert_equal 0, promtool(in_app), "promtool check metrics failed on:\n#{in_app}"
        assert_match(/^memkit_process_pss_bytes\{pid="#{server.pid}",role="master"\} \d+$/, in_app)
        assert_match(/^memkit_oobgc_requests_total\{pid="\d+"\} \d+$/, in_app)
        assert_match(/^memkit_oobgc_watched_runs_total\{pid="\d+"\} \d+$/, in_app)
        assert_match(/^memkit_gc_runs_total\{pid="(#{workers.join('|')})",kind="minor"\} \d+$/, in_app)

        prom_port = free_port
        File.write(File.join(dir, "prometheus.yml"), <<~YAML)
          global:
            scrape_interval: 1s
            scrape_timeout: 1s
          scrape_configs:
            - job_name: memkit
              static_configs:
                - targets: ["127.0.0.1:#{port}"]
        YAML
        prometheus = spawn("prometheus", "--config.file=#{dir}/prometheus.yml", "--storage.tsdb.path=#{dir}/data",
                           "--web.listen-address=127.0.0.1:#{prom_port}", "--log.level=warn",
                           out: File.join(dir, "prometheus.log"), err: [:child, :out], pgroup: true)
        stored = wait_until(timeout: 40, interval: 0.5, message: "prometheus to scrape memkit metrics") do
          result = query(prom_port, "memkit_process_pss_bytes")
          result if result && result.size == 3
        end
        tree = JSON.parse(memkit("tree", server.pid, "--json")[0])
        by_pid = tree["processes"].to_h { |p| [p["pid"], p] }
        stored.each do |sample|
          pid = sample["metric"]["pid"].to_i
          assert_equal "memkit", sample["metric"]["job"]
          assert_within_5_percent by_pid.fetch(pid)["pss"], sample["value"][1].to_f, "pss of #{pid}"
        end
        { "memkit_tree_pss_bytes" => "pss", "memkit_tree_rss_bytes" => "rss", "memkit_tree_uss_bytes" => "uss" }.each do |metric, key|
          value = query(prom_port, metric)&.first&.dig("value", 1)
          assert value, "prometheus has no #{metric}"
          assert_within_5_percent tree["total"][key], value.to_f, metric
        end
        up = query(prom_port, "up{job=\"memkit\"}")
        assert_equal "1", up.first["value"][1]
      ensure
        [[prometheus, :TERM], [exporter, :TERM]].each { |pid, sig| stop_process(pid, sig) }
        stop_server(server)
      end
    end
  end

  private

  def assert_within_5_percent(expected, actual, what)
    assert_operator expected, :>, 0, what
    assert_in_delta expected, actual, expected * 0.05, "#{what}: memkit tree #{expected}, prometheus #{actual}"
  end

  def children(pid)
    Dir.glob("/proc/[0-9]*/stat").filter_map do |f|
      stat = File.read(f)
      stat[(stat.rindex(")") + 2)..].split(" ", 3)[1].to_i == pid ? File.basename(File.dirname(f)).to_i : nil
    rescue SystemCallError
      nil
    end.sort
  end

  def http_get(port, path)
    response = Net::HTTP.get_response(URI("http://127.0.0.1:#{port}#{path}"))
    assert_equal "200", response.code, response.body
    assert_match(%r{\Atext/plain; version=0\.0\.4}, response["content-type"])
    response.body
  end

  def promtool(text)
    out, status = Open3.capture2e("promtool", "check", "metrics", stdin_data: text)
    puts out unless out.empty?
    out.empty? ? status.exitstatus : -1
  end

  def query(port, expr)
    uri = URI("http://127.0.0.1:#{port}/api/v1/query")
    uri.query = URI.encode_www_form(query: expr)
    body = JSON.parse(Net::HTTP.get(uri))
    body["status"] == "success" && !body["data"]["result"].empty? ? body["data"]["result"] : nil
  rescue SystemCallError, JSON::ParserError, EOFError
    nil
  end

  def stop_process(pid, signal)
    return unless pid

    Process.kill(signal, pid)
    Timeout.timeout(15) { Process.wait(pid) }
  rescue Timeout::Error
    Process.kill(:KILL, pid)
    Process.wait(pid)
  rescue Errno::ESRCH, Errno::ECHILD
    nil
  end
end
