# frozen_string_literal: true

module Memkit
  module Soak
    # Calls a Rack app from a config.ru in this process, as a server would:
    # a fresh env per request, the body iterated and closed, then the
    # rack.response_finished and rack.after_reply callbacks run. No sockets,
    # so nothing but the app allocates between samples.
    class RackDriver
      attr_reader :path, :app

      # The env a bare loop would use: what every request's env starts from.
      def base_env = @env

      def initialize(path, url_path: "/")
        @path = File.expand_path(path.to_s)
        if File.directory?(@path)
          hint = File.file?(File.join(@path, "config.ru")) ? ": soak #{File.join(path.to_s, 'config.ru')}" : ""
          raise InvalidArgument, "#{path} is a directory, not a config.ru#{hint}"
        end
        raise InvalidArgument, "no such file: #{path}" unless File.exist?(@path)
        raise InvalidArgument, "not a regular file: #{path}" unless File.file?(@path)
        raise InvalidArgument, "not a Rack config (expected a .ru file): #{path}" unless @path.end_with?(".ru")

        @app = load_app
        @env = build_env(url_path)
        @served = 0
        renew
      end

      def label = File.basename(@path)

      # Serves n requests; returns n. This loop is the overhead
      # bench/soak_overhead.rb compares against a bare `app.call(env.dup)`:
      # within a few percent of it even on a 0.3 us app, so it stays in Ruby
      # (a C version of the per-request checks measured no faster).
      #
      # Each env is a copy of a template that already holds rack.input and the
      # two callback arrays: storing three keys into each copy cost as much as
      # a 1 us app. The copy is Hash#merge, not #dup: dup reaches
      # Hash#initialize_copy through a method call, a quarter of the cost of
      # copying 18 entries (cachegrind, Ruby 3.1). The input has no state to
      # reset; the arrays are shared only while no request registers a
      # callback: one that does takes them along and the next request gets
      # new ones.
      def drive(n)
        drive_loop(n)
        @served += n
        n
      end

      def close = nil

      # The body of a GET: empty, and with no position, so one serves every
      # request. Rack's input interface, as a StringIO of "" would answer it.
      module NullInput
        def self.gets(*) = nil
        def self.each = self

        def self.read(length = nil, buffer = nil)
          buffer&.clear
          length.nil? || length.zero? ? (buffer || +"") : nil
        end

        def self.rewind = 0
        def self.size = 0
        def self.eof? = true
        def self.close = nil
      end

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

      def drive_loop(n)
        app = @app
        template = @template
        finished = @finished
        after = @after
        i = 0
        while i < n
          response = app.call(env = template.merge)
          unless response[2].instance_of?(Array) && finished.empty? && after.empty?
            finish(env, response)
            template = @template
            finished = @finished
            after = @after
          end
          i += 1
        end
      rescue StandardError, ScriptError => e
        raise app_error(e, i)
      end

      # What a server does after the app returns, beyond the common case: an
      # Array body is already generated; anything else may do its work while
      # iterated (or, streaming, when called). Then the callbacks any
      # middleware registered.
      def finish(env, response)
        body = response[2]
        unless body.instance_of?(Array)
          if body.respond_to?(:each)
            body.each { |_chunk| }
          elsif body.respond_to?(:call)
            body.call(NullStream)
          end
          body.close if body.respond_to?(:close)
        end
        return if @finished.empty? && @after.empty?

        finished = @finished
        after = @after
        renew
        finished.each { |cb| cb.call(env, response[0], response[1], nil) }
        after.each(&:call)
      end

      # before: requests finished before the one that raised.
      def app_error(error, before)
        Error.new("#{label}: the app raised on request #{@served + before + 1}: #{error.class}: #{error.message}")
      end

      def load_app
        begin
          require "rack"
          require "rack/builder"
        rescue LoadError
          raise Unsupported, "soaking #{File.basename(@path)} needs the rack gem " \
                           "(add it to your Gemfile, or soak a URL with pid:)"
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

      # New callback arrays in a new template.
      def renew
        @finished = []
        @after = []
        @template = @env.merge("rack.input" => NullInput, "rack.response_finished" => @finished,
                               "rack.after_reply" => @after).freeze
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
