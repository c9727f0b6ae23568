# frozen_string_literal: true

require "socket"
require_relative "../metrics"

module Memkit
  class CLI
    # memkit metrics --pid MASTER [--listen 127.0.0.1:9394]: a Prometheus
    # exporter for any process tree, on a plain TCPServer (no gems).
    class Metrics < Command
      DEFAULT_LISTEN = "127.0.0.1:9394"
      # A scraper that connects and says nothing must not hold the exporter.
      READ_TIMEOUT = 5

      def call(argv)
        parse(argv, "--pid PID [--listen HOST:PORT] [--once]") do |o|
          o.on("--pid PID", "root of the tree to export (the server's master)") { |p| options[:pid] = p }
          o.on("--listen HOST:PORT", "address to serve /metrics on (default #{DEFAULT_LISTEN}; port 0 picks one)") { |l| options[:listen] = l }
          o.on("--once", "print the exposition once to stdout and exit") { options[:once] = true }
        end
        raise UsageError, "unexpected argument #{argv.first.inspect}" unless argv.empty?
        raise UsageError, "--pid is required" unless options[:pid]

        pid = ProcFS.pid!(options[:pid])
        if options[:once]
          text = Memkit::Metrics.render(pid)
          out.print text
          return text.include?("\nmemkit_up 1\n") ? 0 : 1
        end

        Memkit.tree(pid) # fail now, not at the first scrape, if the pid is wrong
        serve(pid, *listen_address)
      end

      private

      def listen_address
        host, port = (options[:listen] || DEFAULT_LISTEN).then { |l| l.include?(":") ? l.split(/:(?=\d+\z)/, 2) : ["127.0.0.1", l] }
        host = host.delete_prefix("[").delete_suffix("]")
        raise UsageError, "--listen: not HOST:PORT: #{options[:listen].inspect}" unless port&.match?(/\A\d+\z/) && port.to_i < 65_536

        [host.empty? ? "127.0.0.1" : host, port.to_i]
      end

      def serve(pid, host, port)
        server = TCPServer.new(host, port)
      rescue SystemCallError, SocketError => e
        raise Error, "cannot listen on #{host}:#{port}: #{e.message}"
      else
        addr = server.local_address
        out.puts "memkit metrics: pid #{pid} on http://#{addr.ip_address.include?(':') ? "[#{addr.ip_address}]" : addr.ip_address}:#{addr.ip_port}/metrics"
        out.flush
        stop = false
        %w[INT TERM].each { |sig| trap(sig) { stop = true } }
        until stop
          next unless server.wait_readable(0.5)

          begin
            client = server.accept_nonblock(exception: false)
            next if client == :wait_readable

            respond(client, pid)
          rescue SystemCallError, IOError
            nil # the scraper went away; the next one is not affected
          ensure
            client.close if client.is_a?(Socket) || client.is_a?(TCPSocket)
          end
        end
        0
      ensure
        server&.close
      end

      def respond(client, pid)
        request = read_head(client) or return
        method, path = request.split(" ", 3)
        status, type, body =
          if !%w[GET HEAD].include?(method)
            [405, "text/plain", "GET only\n"]
          elsif path.start_with?("/metrics")
            [200, Memkit::Metrics::CONTENT_TYPE, Memkit::Metrics.render(pid)]
          elsif path == "/"
            [200, "text/plain", "memkit metrics for pid #{pid}: /metrics\n"]
          else
            [404, "text/plain", "not found: try /metrics\n"]
          end
        reason = { 200 => "OK", 404 => "Not Found", 405 => "Method Not Allowed" }.fetch(status)
        head = "HTTP/1.1 #{status} #{reason}\r\ncontent-type: #{type}\r\ncontent-length: #{body.bytesize}\r\nconnection: close\r\n\r\n"
        client.write(method == "HEAD" ? head : head + body)
      end

      # The request line, after reading (and ignoring) the headers.
      def read_head(client)
        data = +""
        deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + READ_TIMEOUT
        until data.include?("\r\n\r\n") || data.include?("\n\n")
          left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
          return if left <= 0 || data.bytesize > 16_384 || !client.wait_readable(left)

          chunk = client.read_nonblock(4096, exception: false)
          return if chunk.nil?

          data << chunk unless chunk == :wait_readable
        end
        data[/\A[^\r\n]*/]
      end
    end
  end
end
