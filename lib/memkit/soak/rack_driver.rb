# frozen_string_literal: true

require "stringio"

module Memkit
  module Soak
    # Calls a Rack app from a config.ru in this process, as a server would:
    # a fresh env per request, the body iterated and closed, then the
    # rack.response_finished and rack.after_reply callbacks run. No sockets,
    # so nothing but the app allocates between samples.
    class RackDriver
      EMPTY = "".b.freeze
      attr_reader :path, :app

      # The frozen env every request starts from (a copy is made per request).
      def base_env = @env

      def initialize(path, url_path: "/")
        @path = File.expand_path(path.to_s)
        raise InvalidArgument, "no such file: #{path}" unless File.file?(@path)
        raise InvalidArgument, "not a Rack config (expected a .ru file): #{path}" unless @path.end_with?(".ru")

        @app = load_app
        @env = build_env(url_path)
        @served = 0
        @input = StringIO.new(EMPTY)
      end

      def label = File.basename(@path)

      # Serves n requests; returns n. Kept tight: this loop is the overhead
      # bench/soak_overhead.rb compares against a bare `app.call(env)` loop.
      def drive(n)
        app = @app
        base = @env
        i = 0
        while i < n
          env = base.dup
          # One empty input shared by all requests (a GET has no body), made
          # again only if an app closed it: an allocation less per request.
          @input = StringIO.new(EMPTY) if @input.closed?
          @input.rewind
          env["rack.input"] = @input
          finished = env["rack.response_finished"] = []
          after = env["rack.after_reply"] = []
          status, headers, body = app.call(env)
          # An Array body is already generated; anything else may do its work
          # while iterated (or, streaming, when called), as a server would.
          unless body.instance_of?(Array)
            if body.respond_to?(:each)
              body.each { |_chunk| }
            elsif body.respond_to?(:call)
              body.call(NullStream)
            end
            body.close if body.respond_to?(:close)
          end
          finished.each { |cb| cb.call(env, status, headers, nil) } unless finished.empty?
          after.each(&:call) unless after.empty?
          i += 1
        end
        @served += n
        n
      rescue StandardError, ScriptError => e
        raise Error, "#{label}: the app raised on request #{@served + i + 1}: #{e.class}: #{e.message}"
      end

      def close = nil

      # Stands in for the socket a streaming body writes to.
      module NullStream
        def self.write(data) = data.bytesize
        def self.read(*) = nil
        def self.flush = self
        def self.close = nil
        def self.close_write = nil
        def self.close_read = nil
        def self.closed? = false
      end

      private

      def load_app
        begin
          require "rack"
          require "rack/builder"
        rescue LoadError
          raise Unsupported, "memkit soak #{File.basename(@path)} needs the rack gem (add it to your Gemfile, or soak a URL with --pid)"
        end
        app = Rack::Builder.parse_file(@path)
        app = app.first if app.is_a?(Array) # Rack 2 returns [app, options]
        raise Error, "#{label}: loaded, but did not `run` an app" unless app.respond_to?(:call)

        app
      rescue SyntaxError => e
        line = e.message[/:(\d+):/, 1]
        raise Error, "#{label}: syntax error#{" on line #{line}" if line}: " \
                     "#{e.message.lines.grep_v(/\A\s|\^/).last.to_s.sub(/\A.*?:\d+: /, '').strip}"
      rescue Memkit::Error
        raise
      rescue StandardError, ScriptError => e
        where = e.backtrace&.find { |l| l.start_with?(@path) }&.then { |l| " (line #{l[/:(\d+):/, 1]})" }
        raise Error, "#{label}: loading failed#{where}: #{e.class}: #{e.message.lines.first&.strip}"
      end

      def build_env(url_path)
        path, query = url_path.split("?", 2)
        {
          "REQUEST_METHOD" => "GET", "SCRIPT_NAME" => "", "PATH_INFO" => path, "QUERY_STRING" => query.to_s,
          "SERVER_NAME" => "127.0.0.1", "SERVER_PORT" => "80", "SERVER_PROTOCOL" => "HTTP/1.1",
          "HTTP_HOST" => "127.0.0.1", "REMOTE_ADDR" => "127.0.0.1",
          "rack.url_scheme" => "http", "rack.errors" => $stderr, "rack.multithread" => false,
          "rack.multiprocess" => false, "rack.run_once" => false, "rack.hijack?" => false
        }.freeze
      end
    end
  end
end
