# frozen_string_literal: true

require "socket"

module Memkit
  class Metrics
    # A minimal HTTP/1.1 server for a Metrics page (any Rack-style app that
    # answers GET), on a plain TCPServer, with no gems: for exporting a
    # server's tree from outside it (`memkit metrics`).
    #
    #   server = Memkit::Metrics::Server.new(Memkit::Metrics.new(root: pid)).start
    #   server.url   # => "http://127.0.0.1:9394/metrics"
    #   server.run   # until #stop (from a signal handler or another thread)
    #
    # One connection at a time, closed after each response: a scraper is
    # the only client, and a scrape takes milliseconds. It listens on
    # 127.0.0.1 unless told otherwise.
    class Server
      DEFAULT_HOST = "127.0.0.1"
      DEFAULT_PORT = 9394
      REASONS = { 200 => "OK", 404 => "Not Found", 405 => "Method Not Allowed", 500 => "Internal Server Error" }.freeze

      # app: responds to call(env) like Metrics. port 0 picks a free one.
      # read_timeout: seconds a connected client may take to send its
      #   request; a scraper that connects and says nothing must not hold it.
      # tick: seconds between two calls of on_tick while idle (an exporter's
      #   check that its target is still there).
      def initialize(app, host: DEFAULT_HOST, port: DEFAULT_PORT, read_timeout: 5, tick: 0.5, on_tick: nil)
        @app = app
        @host = host
        @port = Integer(port)
        raise InvalidArgument, "Memkit::Metrics::Server port: expected 0..65535, got #{port.inspect}" unless (0..65_535).cover?(@port)

        @read_timeout = read_timeout
        @tick = tick
        @on_tick = on_tick
        @stop = false
      end

      def start
        @server = TCPServer.new(@host, @port)
        self
      rescue SystemCallError, SocketError => e
        raise Error, "cannot listen on #{@host}:#{@port}: #{e.message}"
      end

      def port = @server.local_address.ip_port

      def url
        ip = @server.local_address.ip_address
        "http://#{ip.include?(':') ? "[#{ip}]" : ip}:#{port}/metrics"
      end

      # Serves until #stop; returns after closing the socket.
      def run
        start unless @server
        next_tick = clock + @tick
        until @stop
          if clock >= next_tick
            @on_tick&.call
            next_tick = clock + @tick
          end
          next unless @server.wait_readable([next_tick - clock, 0.01].max)

          client = @server.accept_nonblock(exception: false)
          next if client == :wait_readable

          serve(client)
        end
      ensure
        close
      end

      # Safe in a trap handler: it only sets a flag the loop checks.
      def stop
        @stop = true
      end

      def close
        @server&.close
      rescue IOError
        nil
      end

      private

      def clock = Process.clock_gettime(Process::CLOCK_MONOTONIC)

      def serve(client)
        request = read_head(client) or return
        method, target = request.split(" ", 3)
        path = target.to_s.split("?", 2).first
        status, type, body = respond(method, path)
        head = "HTTP/1.1 #{status} #{REASONS.fetch(status)}\r\ncontent-type: #{type}\r\n" \
               "content-length: #{body.bytesize}\r\nconnection: close\r\n\r\n"
        client.write(method == "HEAD" ? head : head + body)
      rescue SystemCallError, IOError
        nil # the scraper went away; the next one is not affected
      ensure
        client.close
      end

      def respond(method, path)
        return [405, "text/plain", "GET only\n"] unless %w[GET HEAD].include?(method)

        case path
        when "/metrics"
          status, headers, body = @app.call("REQUEST_METHOD" => "GET", "PATH_INFO" => path)
          text = +""
          body.each { |chunk| text << chunk }
          body.close if body.respond_to?(:close)
          [status, headers.fetch("content-type", "text/plain"), text]
        when "/" then [200, "text/plain", "memkit metrics: /metrics\n"]
        else [404, "text/plain", "not found: try /metrics\n"]
        end
      end

      # The request line, after reading (and ignoring) the headers.
      def read_head(client)
        data = +""
        deadline = clock + @read_timeout
        until data.include?("\r\n\r\n") || data.include?("\n\n")
          left = deadline - clock
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
