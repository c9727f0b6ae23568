# frozen_string_literal: true

require "test_helper"
require "net/http"
require "support/pitchfork_server"

# Real Pitchfork: Memkit.warmup runs in the mold (the process every worker is
# forked from), and Memkit::MemoryLimit has bloated workers replaced the way
# Pitchfork replaces a worker (SIGQUIT: finish the request, exit; the monitor
# has the mold fork a new one), with no failed request.
class PitchforkTest < Minitest::Test
  include Memkit::PitchforkServer

  APP = <<~RUBY
    require "memkit"
    LEAK = []
    use Memkit::MemoryLimit, max_uss: ENV.fetch("MAX_USS"), jitter: 0.2
    run lambda { |env|
      # 2 MiB that stay: the worker's USS grows with every request.
      LEAK << ("x" * (2 << 20)) unless env["PATH_INFO"] == "/ping"
      [200, { "content-type" => "text/plain" }, [Process.pid.to_s]]
    }
  RUBY

  # The hook's name and arguments are Pitchfork's (Configurator#after_mold_fork).
  HOOKS = <<~RUBY
    after_mold_fork do |server, mold|
      report = Memkit.warmup
      server.logger.info("memkit: warmup in pid=\#{Process.pid} (\#{mold.to_log}): " \\
                         "\#{report.skipped ? 'skipped' : report.steps.join(', ')}")
    end
  RUBY

  def test_warmup_in_the_mold_and_bloated_workers_replaced_without_failed_requests
    begin
      Gem.bin_path("pitchfork", "pitchfork")
    rescue Gem::Exception
      skip "needs the pitchfork gem (bundle install)"
    end

    Dir.mktmpdir("memkit-pitchfork") do |dir|
      server = start_pitchfork(APP, dir: dir, port: free_port, env: { "MAX_USS" => "90MB" }, check_path: "/ping",
                                    extra: HOOKS)
      begin
        # The mold is the monitor's child that is no worker; the warm-up ran
        # there, once, and not in the monitor or a worker.
        warm = wait_until(timeout: 30, message: "the warm-up log line") do
          server.log_text[/memkit: warmup in pid=(\d+) \((.*?)\): (.*)$/] && Regexp.last_match
        end
        mold_pid = warm[1].to_i
        refute_equal server.pid, mold_pid
        assert_match(/mold/, warm[2])
        refute_equal "skipped", warm[3]
        assert_equal 1, server.log_text.scan("memkit: warmup in pid=").size
        worker_pids = Memkit.tree(server.pid).nodes.select { |n| n.command.include?("worker[") }.map(&:pid)
        refute_includes worker_pids, mold_pid

        stop_file = File.join(dir, "stop")
        clients = Array.new(3) { |i| spawn_client(server.port, stop_file, File.join(dir, "client#{i}.out")) }
        seen = {}
        wait_until(timeout: 90, interval: 0.2, message: "3 worker replacements under Pitchfork") do
          clients.each do |c|
            File.foreach(c[:out]) { |l| seen[l.to_i] = true if l.match?(/\A\d+$/) } if File.exist?(c[:out])
          end
          seen.size >= 2 + 3
        end
        File.write(stop_file, "")
        results = clients.map do |c|
          Process.waitpid(c[:pid])
          File.readlines(c[:out], chomp: true)
        end
        lines = results.flatten
        errors = lines.grep(/\AFAIL/)
        served = lines.grep(/\A\d+\z/).size
        log = server.log_text
        replaced = log.scan(/memkit: worker (\d+) uss .* asking pitchfork to replace it \(SIGQUIT\)/).flatten
                      .map(&:to_i)
        assert_empty errors, "failed requests (#{served} served):\n#{errors.first(5).join("\n")}"
        assert_operator replaced.size, :>=, 3, log[-3000..]
        assert_equal replaced.uniq, replaced
        # Pitchfork saw each replaced worker exit cleanly, and forked others.
        replaced.each do |pid|
          wait_until(timeout: 30, message: "Pitchfork reaping worker #{pid} (exit 0)") do
            server.log_text.match?(/pid=#{pid} .*reaped .*exit 0/)
          end
        end
        refute_includes replaced, mold_pid
        puts "\npitchfork: #{served} requests, #{seen.size} worker pids, #{replaced.size} replacements, 0 failed; " \
             "warm-up in mold #{mold_pid}: #{warm[3]}"
      ensure
        File.write(stop_file, "") if stop_file
        clients&.each do |c|
          Process.kill(:KILL, c[:pid])
          Process.waitpid(c[:pid])
        rescue Errno::ESRCH, Errno::ECHILD
          nil
        end
        Memkit::ServersHelper.stop_server(server)
      end
    end
  end

  private

  # One client process: GET /leak in a loop, one request per connection
  # (Pitchfork closes every connection, as Unicorn does), writing each
  # responding pid, or FAIL and the reason, one per line.
  def spawn_client(port, stop_file, out)
    pid = fork do
      File.open(out, "w") do |f|
        f.sync = true
        until File.exist?(stop_file)
          begin
            response = Net::HTTP.get_response(URI("http://127.0.0.1:#{port}/leak"))
            f.puts(response.is_a?(Net::HTTPSuccess) ? response.body.to_i : "FAIL status #{response.code}")
          rescue StandardError => e
            f.puts "FAIL #{e.class}: #{e.message}"
          end
        end
      end
      exit!(0)
    end
    { pid: pid, out: out }
  end
end
