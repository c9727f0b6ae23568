# frozen_string_literal: true

require "test_helper"
require_relative "../../bench/cow_servers"

# Real Unicorn and real Puma (cluster), 4 workers each, on 127.0.0.1, booting
# bench/cow_app.ru through their public hooks: Unicorn's before_fork, Puma's
# before_fork and `plugin :memkit`, each also with `require "memkit/fork"`.
# The app is small here (scale 0.25) and each worker serves 60 requests;
# bench/cow_servers.rb runs the full-size measurement.
class ServersForkTest < Minitest::Test
  SCALE = 0.25
  REQUESTS = 60

  def boot(name, mode)
    server = CowServers.start(name, mode, port: free_port, scale: SCALE, requests: REQUESTS)
    yield server
  ensure
    CowServers.stop(server)
  end

  # Every worker reports how its master was prepared.
  def worker_reports(server)
    reports = {}
    wait_until(timeout: 60, message: "/memkit from all 4 workers") do
      Array.new(4) { Thread.new { CowServers.get(server.port, "/memkit") } }.each do |t|
        body = t.value or next
        info = JSON.parse(body, symbolize_names: true)
        reports[info[:pid]] = info
      end
      reports.size >= 4
    end
    reports.values
  end

  def assert_prepared_once(server)
    workers = CowServers.worker_pids(server)
    assert_equal 4, workers.size
    reports = worker_reports(server)
    assert_equal workers.sort, reports.map { |r| r[:pid] }.sort
    reports.each do |r|
      assert_equal server.pid, r[:ppid]
      assert_equal 1, r[:warmup_runs], "the master did the warmup work exactly once: #{r.inspect}"
      refute_nil r[:last_report]
    end
    reports
  end

  def shared_after_work(server)
    CowServers.drive(server, REQUESTS, clients: 4)
    CowServers.gc_all(server, hold: 0.4)
    CowServers.measure(server)[:workers].map { |w| w[:shared_pct] }
  end

  # Three boots: a plain Unicorn, Unicorn with its before_fork hook and
  # memkit/fork, Puma with the plugin and memkit/fork; the same app and work.
  def test_unicorn_hook_and_puma_plugin_prepare_once_and_share_more_than_plain
    plain = boot("unicorn", "none") do |server|
      assert_equal 0, JSON.parse(CowServers.get(server.port, "/memkit"))["warmup_runs"]
      shared_after_work(server)
    end
    boot("unicorn", "hook+fork") do |server|
      reports = assert_prepared_once(server)
      assert reports.all? { |r| r[:fork_hook] }
      # before_fork runs once per worker: the first call works, the rest find the heap unchanged.
      assert reports.any? { |r| r[:last_report][:skipped] }, reports.inspect
      prepared = shared_after_work(server)
      assert_operator prepared.min, :>, plain.sum / plain.size + 5,
                      "every prepared Unicorn worker shares more than a plain one: #{prepared} vs #{plain}"
    end
    boot("puma", "plugin+fork") do |server|
      assert_prepared_once(server)
      assert_match(/memkit: heap prepared for fork \(before_fork\)/, File.read(server.log))
      prepared = shared_after_work(server)
      assert_operator prepared.min, :>, plain.sum / plain.size + 5,
                      "every prepared Puma worker shares more than a plain Unicorn one: #{prepared} vs #{plain}"
    end
  end

  def test_puma_before_fork_hook
    boot("puma", "hook") do |server|
      reports = assert_prepared_once(server)
      # Puma calls before_fork once, before forking all workers.
      assert reports.none? { |r| r[:last_report][:skipped] }, reports.inspect
      refute reports.any? { |r| r[:fork_hook] }
    end
  end
end
