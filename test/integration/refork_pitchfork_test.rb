# frozen_string_literal: true

require "test_helper"
require "support/pitchfork_server"

# Memkit::Refork::Pitchfork on real Pitchfork: a worker whose USS grew past
# the policy's threshold asks the monitor for a refork (USR2), the monitor
# promotes a worker to a new mold, and that mold runs Memkit.warmup before it
# forks the next generation. No refork_after: only memkit can trigger one.
class ReforkPitchforkTest < Minitest::Test
  include Memkit::PitchforkServer

  APP = <<~RUBY
    CACHE = []
    run lambda { |env|
      CACHE << ("w" * 1_000_000) if CACHE.size < 40
      Array.new(20_000) { |i| i.to_s } # objects enough that the mold's Memkit.warmup has work to do
      [200, { "content-type" => "text/plain" }, ["\#{Process.pid}\\n"]]
    }
  RUBY

  CONFIG = <<~RUBY
    require "memkit/refork/pitchfork"
    memkit = Memkit::Refork::Pitchfork.new(policy: Memkit::Refork::Policy.new(min_requests: 10), every: 4)
    after_mold_fork { |server, mold| memkit.after_mold_fork(server, mold) }
    after_worker_fork { |server, worker| memkit.after_worker_fork(server, worker) }
    after_request_complete { |server, worker, env| memkit.after_request_complete(server, worker, env) }
  RUBY

  def setup
    skip "needs Linux /proc" unless linux?
    begin
      require "pitchfork"
    rescue LoadError
      skip "the pitchfork gem is not installed in this lane"
    end
    skip "Pitchfork cannot refork here (no PR_SET_CHILD_SUBREAPER)" unless Pitchfork::REFORKING_AVAILABLE
  end

  def test_policy_promotes_a_new_mold_that_was_warmed_up
    Dir.mktmpdir do |dir|
      server = start_pitchfork(APP, dir: dir, port: free_port, workers: 2, extra: CONFIG)
      begin
        mold0 = wait_until(message: "the first mold") { process_with(server.pid, "(gen:0) mold") }
        wait_until(message: "the first mold's warm-up line\n#{server.log_text}") do
          server.log_text.match?(/memkit: mold #{mold0}: heap prepared/)
        end

        client = KeepAliveClient.new(server.port)
        wait_until(timeout: 90, interval: 0.01, message: "memkit to ask for a refork\n#{server.log_text}") do
          client.get("/")
          server.log_text.include?("memkit: refork (growth)")
        end
        client.close
        mold1 = wait_until(timeout: 60, message: "a gen:1 mold\n#{server.log_text}") do
          process_with(server.pid, "(gen:1) mold")
        end
        wait_until(timeout: 60, message: "gen:1 workers\n#{server.log_text}") do
          process_with(server.pid, "(gen:1) worker")
        end

        text = server.log_text
        decided = text.index("memkit: refork (growth)")
        # The monitor picks the worker to promote. The keep-alive client's
        # requests all go to one worker; where the other became the mold, it
        # had allocated next to nothing since its fork, and Memkit.warmup
        # said so ("already prepared (unchanged)", seen in the ruby34 lane
        # with the three lanes side by side) instead of preparing it again.
        warmed = text.index(/memkit: mold #{mold1}: heap (prepared|already prepared \(unchanged\))/) or
          flunk "the new mold (pid #{mold1}) did not run Memkit.warmup:\n#{text}"
        assert_operator warmed, :>, decided
        assert_match(/asking the monitor for a refork \(SIGUSR2 to #{server.pid}\)/, text)
        assert_equal 200, KeepAliveClient.new(server.port).get("/")[0], "the new generation serves"
      ensure
        stop_server(server)
      end
    end
  end

  private

  # The pid of a process under master whose command line includes `role`, or nil.
  def process_with(master, role)
    Memkit.tree(master).nodes.find { |n| n.command.include?(role) }&.pid
  end
end
