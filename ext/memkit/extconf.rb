# frozen_string_literal: true

# Optional: Memkit::FiberPool falls back to Ruby when this is not built, so a
# machine without a C compiler gets an empty Makefile and still installs.
# The library lands in a folder named after the Ruby ABI, so builds for two
# Rubies can sit side by side in one checkout (the two CI lanes share it).
require "mkmf"

if have_func("rb_fiber_current", "ruby.h")
  $CFLAGS << " -O2 -Wall"
  create_makefile("memkit/#{RbConfig::CONFIG.fetch("ruby_version")}/fiber_pool_native")
else
  File.write("Makefile", "all install clean:\n\t@:\n")
end
