# frozen_string_literal: true

module Memkit
  # Runs a block once the response has gone to the client, by the best means
  # the server offers. Used by OobGC and MemoryLimit, which must not make the
  # client wait.
  #
  # rack.after_reply (Unicorn, Puma, Pitchfork) runs after the socket is
  # written and, on Unicorn, closed; rack.response_finished is the Rack 3
  # name for the same idea (Puma 6+ has both); elsewhere the body's close,
  # which the Rack spec says a server calls once it has sent the body.
  module AfterReply
    module_function

    # Returns the body to hand back to the server (wrapped only when the
    # server has neither hook).
    def register(env, body, &block)
      if (hooks = env["rack.after_reply"]).is_a?(Array)
        hooks << block
        body
      elsif (hooks = env["rack.response_finished"]).is_a?(Array)
        hooks << ->(_env, _status, _headers, _error) { block.call }
        body
      else
        Body.new(body, block)
      end
    end

    # A response body that calls a block when the server closes it. Everything
    # else (each, to_ary, to_path, call) goes to the wrapped body, so
    # servers that stream files or arrays treat it as they would the original.
    class Body
      def initialize(body, block)
        @body = body
        @block = block
      end

      def close
        @body.close if @body.respond_to?(:close)
      ensure
        block = @block
        @block = nil
        block&.call
      end

      def each(&block)
        @body.each(&block)
      end

      def respond_to_missing?(name, include_all = false)
        name != :to_str && @body.respond_to?(name, include_all)
      end

      def method_missing(name, *args, &block)
        return super unless respond_to_missing?(name)

        @body.__send__(name, *args, &block)
      end
    end
  end
end
