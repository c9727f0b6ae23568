# frozen_string_literal: true

require "test_helper"
require "support/servers"

# `plugin :memkit` with fork_worker on real Puma: the master's watcher sees
# the workers' USS grow, asks Puma to refork (SIGURG), and worker 0 prepares
# its heap in Puma's refork hook before it forks the new workers. fork_worker 0
# turns off Puma's own request-count refork, so only memkit can trigger one.
class ReforkPumaTest < Minitest::Test
  include Memkit::ServersHelper

  # Each request keeps 1 MB more in the worker, up to 40 MB: the private
  # growth of a worker filling caches after fork.
  APP = <<~RUBY
    CACHE = []
    run lambda { |env|
      CACHE << ("w" * 1_000_000) if CACHE.size < 40
      Array.new(20_000) { |i| i.to_s } # objects enough that the mold's Memkit.warmup has work to do
      [200, { "content-type" => "text/plain" }, ["\#{Process.pid} \#{Process.ppid}\\n"]]
    }
  RUBY

  def setup
    skip "needs Linux /proc" unless linux?
  end

  def test_memkit_policy_reforks_puma_from_the_gemfile
    Dir.mktmpdir do |dir|
      server = start_server(:puma, APP, dir: dir, port: free_port, workers: 3, extra: "fork_worker 0\nplugin :memkit")
      begin
        assert_reforked_by_memkit(server, "before_refork")
      ensure
        stop_server(server)
      end
    end
  end

  # Debian 12's puma package (5.6) names the hook on_refork and has no
  # log_writer. Puma 5 reforks only without preload_app!, so worker 0 loads the app.
  def test_memkit_policy_reforks_debians_puma_5
    version = debian_puma_version
    skip "Debian's puma package (Puma 5.x, /usr/bin/puma) is not installed in this lane" unless version

    Dir.mktmpdir do |dir|
      port = free_port
      File.write(File.join(dir, "config.ru"), APP)
      File.write(File.join(dir, "puma.rb"), <<~RUBY)
        workers 3
        threads 1, 1
        bind "tcp://127.0.0.1:#{port}"
        rackup #{File.join(dir, 'config.ru').inspect}
        directory #{dir.inspect}
        worker_check_interval 1
        fork_worker 0
        plugin :memkit
      RUBY
      log = File.join(dir, "puma.log")
      pid = Process.spawn(clean_env, "/usr/bin/ruby", "-I", LIB, "/usr/bin/puma", "_#{version}_", "-C",
                          File.join(dir, "puma.rb"), chdir: dir, out: [log, "a"], err: [:child, :out], pgroup: true)
      server = Server.new(kind: :puma, pid: pid, port: port, log: log, dir: dir)
      begin
        wait_until(timeout: 60, message: "Puma #{version} to answer") { answering?(port, "/") }
        assert_match(/Puma version: 5\./, server.log_text)
        assert_reforked_by_memkit(server, "on_refork")
      ensure
        stop_server(server)
      end
    end
  end

  private

  def assert_reforked_by_memkit(server, hook)
    # The server answers once worker 0 is up; it forks the other two after.
    workers_before = wait_until(timeout: 30, message: "worker 0 to fork the other two") do
      now = children_of_worker0(server.pid)
      now if now.values.first&.size == 2
    end
    worker0 = workers_before.keys.first

    # Fresh connections spread the requests over the workers; keep going until
    # the watcher (every 5 s, twice in a row) decides.
    wait_until(timeout: 90, interval: 0.05, message: "memkit to ask for a refork\n#{server.log_text}") do
      3.times { get(server.port) }
      server.log_text.include?("memkit: refork (")
    end
    wait_until(timeout: 60, message: "the refork to finish\n#{server.log_text}") do
      now = children_of_worker0(server.pid)
      now.fetch(worker0, []).size == 2 && (now.fetch(worker0) & workers_before.fetch(worker0)).empty?
    end

    text = server.log_text
    decided = text.index("memkit: refork (growth)") or flunk "the policy's decision is not logged:\n#{text}"
    warmed = text.index(/memkit: heap prepared for fork \(#{hook}\) in pid #{worker0}\b/) or
      flunk "worker 0 (pid #{worker0}) did not run Memkit.warmup in #{hook}:\n#{text}"
    assert_operator warmed, :>, decided, "worker 0 prepared its heap after the policy asked for the refork"
    assert_match(/asking Puma to refork \(SIGURG to #{server.pid}\)/, text)
    assert_equal [worker0], children_of_worker0(server.pid).keys, "worker 0 stays; the others are forked again"
  end

  # { worker 0's pid => [pids of the workers it forked] }
  def children_of_worker0(master)
    tree = Memkit.tree(master)
    tree.nodes.select { |n| n.depth == 1 }.to_h do |w0|
      [w0.pid, tree.nodes.select { |n| n.ppid == w0.pid && n.depth == 2 }.map(&:pid)]
    end
  end

  def get(port)
    client = KeepAliveClient.new(port)
    client.get("/")
  ensure
    client&.close
  end

  # The version of Debian's puma package, run by /usr/bin/ruby outside bundler, or nil.
  def debian_puma_version
    return nil unless File.executable?("/usr/bin/ruby") && File.exist?("/usr/bin/puma")

    out, status = Open3.capture2(clean_env, "/usr/bin/ruby", "-e",
                                 'gem "puma", "< 6"; require "puma/const"; print Puma::Const::VERSION')
    status.success? && out.start_with?("5.") ? out : nil
  rescue SystemCallError
    nil
  end

  def clean_env
    %w[RUBYOPT RUBYLIB BUNDLE_GEMFILE BUNDLE_BIN_PATH BUNDLER_SETUP BUNDLER_VERSION GEM_HOME GEM_PATH]
      .to_h { |k| [k, nil] }
  end
end
