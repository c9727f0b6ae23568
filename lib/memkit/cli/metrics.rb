# frozen_string_literal: true

require_relative "../metrics"
require_relative "../metrics/server"

module Memkit
  class CLI
    # memkit metrics --pid MASTER [--listen 127.0.0.1:9394] [--once] [--dir DIR]:
    # a Prometheus exporter for a server's tree (Memkit::Metrics::Server).
    class Metrics < Command
      DEFAULT_LISTEN = "127.0.0.1:9394"

      def call(argv)
        parse(argv, "--pid PID [--listen HOST:PORT] [--once] [--dir DIR]") do |o|
          o.on("--pid PID", "the server's master: the root of the tree to export") { |p| options[:pid] = p }
          o.on("--listen HOST:PORT", "address to serve /metrics on (default #{DEFAULT_LISTEN}; port 0 picks one)") do |l|
            options[:listen] = l
          end
          o.on("--once", "print the exposition once to stdout and exit (1 if the tree is gone)") { options[:once] = true }
          o.on("--dir DIR", "where the workers leave their counters (default: per master, under the temp dir)") do |d|
            options[:dir] = d
          end
        end
        raise UsageError, "unexpected argument #{argv.first.inspect}" unless argv.empty?
        raise UsageError, "--pid is required" unless options[:pid]

        pid = ProcFS.pid!(options[:pid])
        metrics = Memkit::Metrics.new(root: pid, gc: false, dir: options[:dir], logger: err)
        if options[:once]
          text, error = Memkit::Metrics.render_tree(pid, dir: options[:dir])
          out.print text
          raise Error, error if error

          return 0
        end

        Memkit.tree(pid) # fail now, not at the first scrape, if the pid is wrong
        host, port = listen_address
        server = Memkit::Metrics::Server.new(metrics, host: host, port: port, on_tick: -> { metrics.check })
        server.start
        out.puts "memkit metrics: pid #{pid} on #{server.url}"
        out.flush
        %w[INT TERM].each { |sig| trap(sig) { server.stop } }
        server.run
        0
      end

      private

      def listen_address
        listen = options[:listen] || DEFAULT_LISTEN
        host, port = listen.include?(":") ? listen.split(/:(?=\d+\z)/, 2) : ["127.0.0.1", listen]
        host = host.delete_prefix("[").delete_suffix("]")
        raise UsageError, "--listen: not HOST:PORT: #{options[:listen].inspect}" unless port&.match?(/\A\d+\z/) && port.to_i < 65_536

        [host.empty? ? "127.0.0.1" : host, port.to_i]
      end
    end
  end
end
