# frozen_string_literal: true

module Memkit
  # Every error memkit raises on purpose is a Memkit::Error, so callers can
  # rescue one class. Messages name the pid, file or option involved.
  class Error < StandardError; end

  # The process is gone (or never existed), or it exited while we read it.
  class NoSuchProcess < Error; end

  # The pid is a kernel thread (kthreadd and its children): alive, but with
  # no user address space, so no user memory to measure.
  class KernelThread < Error; end

  # The kernel refused to show another user's /proc files (or ptrace checks).
  class PermissionDenied < Error; end

  # No /proc with the files memkit needs: not Linux, or /proc is not mounted.
  class Unsupported < Error; end

  # A /proc file did not have the shape the kernel documents.
  class ParseError < Error; end

  # A bad argument or option value (a pid that is not a number, "3XB").
  class InvalidArgument < Error; end
end
