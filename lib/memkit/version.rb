# frozen_string_literal: true

module Memkit
  VERSION = "0.1.0"
end
