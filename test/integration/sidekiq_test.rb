# frozen_string_literal: true

require "test_helper"
require "support/redis"
require "memkit/sidekiq"

# Real redis-server, real Sidekiq processes, a tiny supervisor that starts a
# new Sidekiq whenever one exits (as systemd or Kubernetes would), and a job
# that leaks: Memkit::Sidekiq::Middleware must have the process replaced
# between jobs, several times, without losing or repeating a job.
class SidekiqTest < Minitest::Test
  include Memkit::RedisHelper

  JOBS = 500

  APP = <<~RUBY
    require "sidekiq"
    require "memkit/sidekiq"

    redis = { path: ENV.fetch("REDIS_SOCK") }
    Sidekiq.configure_client { |config| config.redis = redis }
    Sidekiq.configure_server do |config|
      config.redis = redis
      config.server_middleware do |chain|
        chain.add Memkit::Sidekiq::Middleware, max_uss: ENV.fetch("MAX_USS"), jitter: 0.1
      end
    end

    LEAK = []

    class LeakyJob
      include Sidekiq::Job

      def perform(id)
        LEAK << ("x" * (1 << 20)) # 1 MiB that stays: the process grows with every job
        Array.new(20_000) { |i| "garbage \#{i}" } # and garbage for the GC
        Sidekiq.redis { |r| r.call("RPUSH", "memkit:ran", "\#{id} \#{Process.pid}") }
      end
    end
  RUBY

  # The middleware alone, no Sidekiq: Sidekiq builds a new middleware object
  # per job from the Hash given to chain.add; the process-wide state must
  # still stop the process once, with one line, however many jobs cross.
  def test_one_stop_and_one_line_per_process_across_middleware_objects
    stops = []
    log = StringIO.new
    options = { max_jobs: 5, jitter: 0, logger: log, stop: ->(reason) { stops << reason } }
    threads = Array.new(4) do
      Thread.new { 10.times { Memkit::Sidekiq::Middleware.new(options).call(nil, {}, "default") { :ran } } }
    end
    threads.each(&:join)
    assert_equal 1, stops.size
    assert_match(/\Aserved \d+ jobs/, stops.first)
    assert_equal 1, log.string.lines.size
    assert_match(/\Amemkit: sidekiq #{Process.pid} served \d+ jobs .*; quieting it/, log.string)
    assert_raises(Memkit::InvalidArgument) { Memkit::Sidekiq::Middleware.new(max_jobs: 1, stop: :nope) }
  end

  # Two jobs at a time on a full queue: the process is almost never idle, so
  # OobGC finds few moments between jobs; the limit is what this one tests.
  def test_a_leaking_sidekiq_is_replaced_between_jobs_without_losing_a_job
    run_leaky_jobs(concurrency: 2, gc_between_jobs_in_every_process: false)
  end

  # One job at a time: every gap between jobs is idle, and each process that
  # was replaced had run GC there.
  def test_with_concurrency_1_gc_runs_between_jobs_in_every_process
    run_leaky_jobs(concurrency: 1, gc_between_jobs_in_every_process: true)
  end

  private

  def run_leaky_jobs(concurrency:, gc_between_jobs_in_every_process:)
    skip "needs redis-server (apt-get install redis-server)" unless redis_server_path
    begin
      sidekiq_bin = Gem.bin_path("sidekiq", "sidekiq")
    rescue Gem::Exception
      skip "needs the sidekiq gem (bundle install)"
    end

    Dir.mktmpdir("memkit-sidekiq") do |dir|
      app = File.join(dir, "app.rb")
      File.write(app, APP)
      log = File.join(dir, "sidekiq.log")
      with_redis(dir) do |sock|
        env = { "REDIS_SOCK" => sock, "MAX_USS" => "130MB" }
        push = [RbConfig.ruby, "-I", Memkit::TestHelpers::ROOT + "/lib", "-r", app, "-e",
                "Sidekiq::Client.push_bulk('class' => LeakyJob, 'args' => (0...#{JOBS}).map { |i| [i] })"]
        out, status = Open3.capture2e(env, *push)
        assert status.success?, out
        assert_equal JOBS, redis(sock, "LLEN", "queue:default")

        started = supervise(env, sidekiq_bin, app, log, sock, concurrency)

        ran = redis(sock, "LRANGE", "memkit:ran", "0", "-1")
        text = File.read(log)
        ids = ran.map { |l| l.split.first.to_i }
        by_pid = ran.map { |l| l.split.last.to_i }.tally
        lines = text.lines.grep(/memkit: sidekiq \d+ /)
        replaced = lines.map { |l| l[/memkit: sidekiq (\d+) /, 1].to_i }

        # No job lost, none run twice (none failed, so Sidekiq retried none).
        assert_equal (0...JOBS).to_a, ids.sort, "jobs that ran:\n#{text[-3000..]}"
        assert_equal 0, redis(sock, "ZCARD", "retry")
        assert_equal 0, redis(sock, "ZCARD", "dead")
        assert_equal 0, redis(sock, "LLEN", "queue:default")
        # Over the limit at least 3 times; each process that went was logged
        # once, and every process but the last went that way.
        assert_operator replaced.size, :>=, 3, text[-3000..]
        assert_equal replaced.uniq, replaced, "one line per replacement:\n#{lines.join}"
        # The last process may have crossed the limit with the last jobs.
        assert_includes [started.size - 1, started.size], replaced.size, "processes started #{started.inspect}"
        assert_equal started[0, replaced.size], replaced
        lines.each { |l| assert_match(/uss [\d.]+ MiB > limit [\d.]+ MiB .* after \d+ jobs; quieting it/, l) }
        # Quieted, then stopped by TERM through Sidekiq's own shutdown. The
        # supervisor TERMs the last process once every job has run: if that
        # one crossed the limit with the last job, its TERM can come before
        # the TSTP is handled (Ruby runs the lower signal number first).
        quieted = text.lines.grep(/Received TSTP, no longer accepting new work/).map { |l| l[/pid=(\d+)/, 1].to_i }
        (replaced - [started.last]).each do |pid|
          assert_includes quieted, pid, "started #{started.inspect}:\n#{text.lines.grep(/pid=#{pid} /).last(20).join}"
        end
        # GC ran between jobs: OobGC's counters in each replacement's line.
        between = lines.map { |l| l.match(/GC between jobs: (\d+) minor, (\d+) major/).captures.sum(&:to_i) }
        if gc_between_jobs_in_every_process
          assert between.all?(&:positive?), lines.join
        else
          assert_operator between.sum, :>, 0, lines.join
        end
        puts "\nsidekiq -c #{concurrency}: #{JOBS} jobs by #{by_pid.size} processes " \
             "(#{by_pid.values.join(', ')} jobs each); " \
             "#{replaced.size} replacements; GC between jobs per process: #{between.join(', ')}"
      end
    end
  end

  # Starts Sidekiq, and a new one each time it exits, until every job has
  # run; then stops the last one. Returns the pids started, in order.
  def supervise(env, bin, app, log, sock, concurrency)
    started = []
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 240
    pid = nil
    loop do
      pid ||= Process.spawn(env, RbConfig.ruby, "-I", "#{Memkit::TestHelpers::ROOT}/lib", bin, "-r", app,
                            "-c", concurrency.to_s, "-q", "default", "-t", "25",
                            out: [log, "a"], err: [:child, :out], chdir: File.dirname(app)).tap { |p| started << p }
      break if redis(sock, "LLEN", "memkit:ran") >= JOBS
      flunk "a job failed:\n#{File.read(log)[-3000..]}" if redis(sock, "ZCARD", "retry").positive?

      if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
        flunk "jobs did not finish within 240s:\n#{File.read(log)[-3000..]}"
      end
      if Process.waitpid(pid, Process::WNOHANG)
        assert $?.success?, "sidekiq #{pid} exited with #{$?.inspect}:\n#{File.read(log)[-3000..]}"
        pid = nil
      else
        sleep 0.1
      end
    end
    started
  ensure
    if pid
      Process.kill(:TERM, pid)
      Process.waitpid(pid)
    end
  end

  # One Redis command over the Unix socket, in RESP: Integer, String or Array.
  def redis(sock, *args)
    UNIXSocket.open(sock) do |s|
      s.write("*#{args.size}\r\n" + args.map { |a| "$#{a.to_s.bytesize}\r\n#{a}\r\n" }.join)
      read_reply(s)
    end
  end

  def read_reply(s)
    line = s.gets("\r\n").chomp("\r\n")
    case line[0]
    when ":" then line[1..].to_i
    when "+" then line[1..]
    when "-" then raise "redis: #{line}"
    when "$" then line == "$-1" ? nil : s.read(line[1..].to_i + 2).chomp("\r\n")
    when "*" then Array.new(line[1..].to_i) { read_reply(s) }
    end
  end
end
