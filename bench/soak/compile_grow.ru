# frozen_string_literal: true

# Seed 002 in Ruby: each request's script is compiled into a new method, and
# the compiled code stays in the class's method table for good, as mod_mruby's
# irep table kept every compiled script. (Rails' `render inline:` with a
# source that differs per request did the same with template methods.)
handlers = Module.new
n = 0
run lambda { |env|
  n += 1
  name = "handler_#{n}"
  handlers.module_eval(<<~SRC, "handler.rb", 1)
    def self.#{name}(env)
      "Hello from \#{env['PATH_INFO']} (request #{n}): \#{[1, 2, 3].sum * 7}"
    end
  SRC
  body = handlers.public_send(name, env)
  [200, { "content-type" => "text/plain" }, [body]]
}
