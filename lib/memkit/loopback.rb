# frozen_string_literal: true

require "socket"

module Memkit
  # Ports on 127.0.0.1 for the servers memkit boots (demo, tests, benches).
  module Loopback
    module_function

    # A port nothing listens on right now. Another process may take it before
    # the caller binds it; good enough for a demo or a test on one machine.
    def free_port
      TCPServer.open("127.0.0.1", 0) { |server| server.addr[1] }
    end

    def listening?(port)
      TCPSocket.new("127.0.0.1", port).close
      true
    rescue SystemCallError
      false
    end
  end
end
