# frozen_string_literal: true

# Optional: Memkit::FiberPool and the soak driver fall back to Ruby when this
# is not built, so a machine without Ruby's headers or a C compiler gets an
# empty Makefile and still installs. The library lands in a folder named
# after the Ruby ABI, so builds for two Rubies can sit side by side in one
# checkout (the two CI lanes share it).
require "rbconfig"

# mkmf aborts the whole install when the headers are missing, and raises when
# there is no compiler at all: ask before it can.
buildable = File.exist?(File.join(RbConfig::CONFIG.fetch("rubyhdrdir"), "ruby.h")) &&
            begin
              require "mkmf"
              have_func("rb_fiber_current", "ruby.h")
            rescue RuntimeError
              false
            end

if buildable
  $CFLAGS << " -O2 -Wall"
  create_makefile("memkit/#{RbConfig::CONFIG.fetch("ruby_version")}/memkit_native")
else
  warn "memkit: not building ext/memkit (no C compiler or Ruby headers); memkit will use its Ruby code"
  File.write("Makefile", "all install clean:\n\t@:\n")
end
