# frozen_string_literal: true

require "net/http"
require "uri"

module Memkit
  module Soak
    # Sends GET requests to a server on this machine over keep-alive
    # connections, `concurrency` at a time (one thread and one connection
    # each). Loopback only: a soak is tens of thousands of requests, which
    # nobody should point at another host by accident.
    class UrlDriver
      LOOPBACK = %w[127.0.0.1 localhost ::1 [::1]].freeze

      attr_reader :uri, :concurrency, :errors

      def initialize(url, concurrency: 4, timeout: 10)
        @uri = URI.parse(url.to_s)
        raise InvalidArgument, "not an http:// URL: #{url}" unless @uri.is_a?(URI::HTTP) && !@uri.is_a?(URI::HTTPS)
        unless LOOPBACK.include?(@uri.host)
          raise InvalidArgument, "#{url}: memkit soak only drives servers on 127.0.0.1"
        end

        @concurrency = concurrency
        @timeout = timeout
        @errors = 0
        @connections = []
        probe
      end

      def label = @uri.to_s

      # Serves n requests split over the connections; returns n. Responses
      # with a 5xx status are counted in #errors.
      def drive(n)
        per = Array.new(@concurrency) { |i| n / @concurrency + (i < n % @concurrency ? 1 : 0) }
        threads = per.each_with_index.map do |count, i|
          Thread.new { count.times.count { !request(i) } }
        end
        @errors += threads.sum(&:value)
        n
      end

      def close
        @connections.each { |c| c&.finish if c&.started? }
        @connections.clear
      end

      private

      def request(i)
        http = (@connections[i] ||= connect)
        response = http.request(Net::HTTP::Get.new(@uri.request_uri, "Connection" => "keep-alive"))
        response.body
        response.code.to_i < 500
      rescue IOError, SystemCallError, Net::ReadTimeout, Net::OpenTimeout, EOFError => e
        # A worker killed mid-request (a memory limit doing its job) drops the
        # connection: reconnect and carry on, unless it keeps happening.
        @connections[i] = nil
        retries = (retries || 0) + 1
        raise Error, "#{label}: #{e.message} (#{retries} times in a row)" if retries > 20

        retry
      end

      def connect
        http = Net::HTTP.new(@uri.host.delete("[]"), @uri.port)
        http.open_timeout = @timeout
        http.read_timeout = @timeout
        http.keep_alive_timeout = 30
        http.start
      end

      def probe
        connect.finish
      rescue Errno::ECONNREFUSED
        raise Error, "nothing listens on #{@uri.host}:#{@uri.port} (#{label}): start the server first"
      rescue SystemCallError, Net::OpenTimeout, IOError, SocketError => e
        raise Error, "cannot connect to #{label}: #{e.message}"
      end
    end
  end
end
