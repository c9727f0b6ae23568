# frozen_string_literal: true

require_relative "../native"

module Memkit
  module Soak
    # Calls a Rack app from a config.ru in this process, as a server would:
    # a fresh env per request, the body iterated and closed, then the
    # rack.response_finished and rack.after_reply callbacks run. No sockets,
    # so nothing but the app allocates between samples.
    class RackDriver
      NATIVE = Native::LOADED

      attr_reader :path, :app

      # The env a bare loop would use: what every request's env starts from.
      def base_env = @env

      # native: check responses and copy envs in C (ext/memkit); false forces
      # the Ruby loop, which must behave the same (tests, bench/soak_overhead.rb).
      def initialize(path, url_path: "/", native: NATIVE)
        @path = File.expand_path(path.to_s)
        raise InvalidArgument, "no such file: #{path}" unless File.file?(@path)
        raise InvalidArgument, "not a Rack config (expected a .ru file): #{path}" unless @path.end_with?(".ru")
        raise InvalidArgument, "#{label}: native: true, but ext/memkit is not built (rake compile)" if native && !NATIVE

        @native = native ? true : false
        @app = load_app
        @env = build_env(url_path)
        @served = 0
        renew
      end

      def label = File.basename(@path)

      # Serves n requests; returns n. This loop is the overhead
      # bench/soak_overhead.rb compares against a bare `app.call(env.dup)`;
      # when ext/memkit is built, its per-request checks run in C
      # (#drive_native).
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
        @native ? drive_native(n) : drive_ruby(n)
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

      # Native.soak_next checks the previous response and copies the env in
      # one C call, in place of the bare loop's Hash#merge; it answers false
      # for a response #finish must see to. So each request is finished just
      # before the next one starts, and the last one after the loop.
      def drive_native(n)
        app = @app
        template = @template
        finished = @finished
        after = @after
        native = Native
        return if n.zero?

        response = app.call(env = template.merge)
        i = 1
        while i < n
          unless (fresh = native.soak_next(template, response, finished, after))
            finishing = true
            finish(env, response)
            finishing = false
            template = @template
            finished = @finished
            after = @after
            fresh = template.merge
          end
          response = app.call(env = fresh)
          i += 1
        end
        finishing = true
        finish(env, response) unless native.soak_next(template, response, finished, after)
      rescue StandardError, ScriptError => e
        raise app_error(e, finishing ? i - 1 : i.to_i)
      end

      def drive_ruby(n)
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
