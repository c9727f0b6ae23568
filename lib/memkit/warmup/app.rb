# frozen_string_literal: true

require "stringio"

module Memkit
  module Warmup
    # Representative requests through a Rack app in the master, before the
    # heap is prepared for fork: templates compiled on first render, lazily
    # loaded code, memoized constants and caches then live in the pages the
    # workers share, instead of being written by every worker on its first
    # requests. In-process, no socket: the app's #call with a complete env.
    #
    # Each String is a GET path (a query after "?"); each Hash is a Rack env
    # merged over the default one (say "REQUEST_METHOD", "PATH_INFO",
    # "HTTP_ACCEPT"; a String "rack.input" is wrapped in a StringIO).
    # A request that raises, or answers 5xx, is kept in the results and
    # logged in one line; the others still run, and so does the fork.
    class App
      # One request's outcome. status is nil when the app raised.
      # objects: Ruby objects it allocated; malloc_bytes: what it added to
      # the bytes that start Ruby's next GC (malloc_increase_bytes: mallocs
      # minus frees, so it can be negative), nil when a GC ran during the
      # request and reset that counter.
      Result = Struct.new(:method, :path, :status, :error, :duration, :objects, :malloc_bytes,
                          keyword_init: true) do
        def failed? = !error.nil? || status.to_i >= 500

        def to_h = super
      end

      BASE_ENV = {
        "REQUEST_METHOD" => "GET", "SCRIPT_NAME" => "", "PATH_INFO" => "/", "QUERY_STRING" => "",
        "SERVER_NAME" => "localhost", "SERVER_PORT" => "80", "SERVER_PROTOCOL" => "HTTP/1.1",
        "HTTP_HOST" => "localhost", "HTTP_VERSION" => "HTTP/1.1", "REMOTE_ADDR" => "127.0.0.1",
        "HTTP_USER_AGENT" => "memkit-warmup", "rack.url_scheme" => "http",
        "rack.multithread" => false, "rack.multiprocess" => true, "rack.run_once" => false,
        "rack.hijack?" => false, "memkit.warmup" => true
      }.freeze

      # app: anything with #call(env); requests: Strings and Hashes;
      # logger: nil (warn on stderr), a Logger (#warn) or an IO (#puts).
      def initialize(app, requests, logger: nil)
        raise InvalidArgument, "warmup app: must respond to #call, not #{app.class}" unless app.respond_to?(:call)
        unless requests.is_a?(Array) && requests.all? { |r| r.is_a?(String) || r.is_a?(Hash) }
          raise InvalidArgument,
                "warmup requests: must be an Array of String paths and Hash envs, not #{requests.inspect[0, 80]}"
        end
        bad = requests.find { |r| r.is_a?(String) && !r.start_with?("/") }
        raise InvalidArgument, "warmup requests: a path starts with \"/\", not #{bad.inspect}" if bad

        @app = app
        @requests = requests
        @logger = logger
      end

      def run
        @requests.map { |request| perform(request) }
      end

      # What one request allocates, as a worker will serve it: the medians
      # of the requests after the first (the first also compiles and fills
      # caches once), as { objects:, malloc_bytes: }; nil with fewer than two
      # successful requests, or when a GC ran during every one of them.
      def self.allocation_profile(results)
        ok = results.drop(1).reject(&:failed?)
        objects = ok.map(&:objects).compact
        malloc = ok.map(&:malloc_bytes).compact
        return nil if objects.empty? || malloc.empty?

        { objects: median(objects), malloc_bytes: median(malloc) }
      end

      def self.median(values)
        sorted = values.sort
        sorted[sorted.size / 2]
      end

      # The env for one request: a fresh copy each time, since apps write to it.
      def self.env(request)
        env = BASE_ENV.dup
        if request.is_a?(String)
          path, query = request.split("?", 2)
          env["PATH_INFO"] = path
          env["QUERY_STRING"] = query.to_s
        else
          env.merge!(request.transform_keys(&:to_s))
        end
        input = env["rack.input"]
        env["rack.input"] = StringIO.new(input.is_a?(String) ? input.b : +"".b) unless input.respond_to?(:read)
        env["rack.errors"] ||= $stderr
        env["rack.version"] ||= [1, 3]
        env["rack.after_reply"] ||= []
        env["rack.response_finished"] ||= []
        env["CONTENT_LENGTH"] ||= env["rack.input"].size.to_s if env["rack.input"].respond_to?(:size)
        env
      end

      private

      def perform(request)
        env = self.class.env(request)
        started = clock
        status = error = nil
        gcs = GC.count
        objects = GC.stat(:total_allocated_objects)
        malloc = GC.stat(:malloc_increase_bytes)
        begin
          status, _headers, body = @app.call(env)
          status = Integer(status)
          drain(body)
        rescue StandardError, ScriptError => e
          error = "#{e.class}: #{e.message}"
        end
        finish(env, status, error)
        objects = GC.stat(:total_allocated_objects) - objects
        malloc = GC.count == gcs ? GC.stat(:malloc_increase_bytes) - malloc : nil
        result = Result.new(method: env["REQUEST_METHOD"], path: full_path(env), status: status, error: error,
                            duration: clock - started, objects: objects, malloc_bytes: malloc)
        log(result) if result.failed?
        result
      end

      # Iterating renders what a streaming body renders lazily; closing
      # returns connections and runs the app's after-response code, as a
      # server would.
      def drain(body)
        body.each { |_chunk| nil } if body.respond_to?(:each)
      ensure
        body.close if body.respond_to?(:close)
      end

      # What a server runs once the response is sent (Puma's
      # rack.after_reply, Rack 3's rack.response_finished).
      def finish(env, status, error)
        Array(env["rack.after_reply"]).each(&:call)
        Array(env["rack.response_finished"]).each { |callback| callback.call(env, status, {}, error) }
      rescue StandardError => e
        log_line("memkit warmup: #{full_path(env)} after-response callback raised #{e.class}: #{e.message}")
      end

      def full_path(env)
        query = env["QUERY_STRING"].to_s
        "#{env['SCRIPT_NAME']}#{env['PATH_INFO']}#{"?#{query}" unless query.empty?}"
      end

      def log(result)
        what = result.error ? "raised #{result.error}" : "answered #{result.status}"
        log_line("memkit warmup: #{result.method} #{result.path} #{what}; forking anyway")
      end

      def log_line(line)
        if @logger.nil? then warn(line)
        elsif @logger.respond_to?(:warn) then @logger.warn(line)
        else @logger.puts(line)
        end
      end

      def clock = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end
  end
end
