# frozen_string_literal: true

module Memkit
  module Soak
    # Writes a report file all at once: into a temporary file in the same
    # directory, renamed over the target only when complete. A soak that
    # fails or is interrupted leaves no half-written CSV or plot behind.
    module AtomicFile
      module_function

      def write(path, content)
        tmp = "#{path}.#{Process.pid}.tmp"
        File.write(tmp, content)
        File.rename(tmp, path)
        path
      rescue SystemCallError => e
        raise Error, "cannot write #{path}: #{e.message}"
      ensure
        File.unlink(tmp) if tmp && File.exist?(tmp)
      end

      # Fails before the run, not after minutes of it, if the file cannot be
      # created where asked.
      def check!(path, option)
        dir = File.dirname(File.expand_path(path))
        raise InvalidArgument, "#{option} #{path}: directory #{dir} does not exist" unless File.directory?(dir)
        raise InvalidArgument, "#{option} #{path}: directory #{dir} is not writable" unless File.writable?(dir)
        raise InvalidArgument, "#{option} #{path}: is a directory" if File.directory?(path)
      end
    end
  end
end
