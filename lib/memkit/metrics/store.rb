# frozen_string_literal: true

require "fileutils"
require "tmpdir"

module Memkit
  class Metrics
    # A directory where each worker of one server leaves its counters (GC,
    # OobGC, MemoryLimit), one small file per worker, so that whichever
    # process answers a scrape -- a worker, the master, or `memkit metrics`
    # outside the server -- reports all of them.
    #
    # A worker with an index writes worker-INDEX, which its replacement (same
    # index) overwrites: a replaced worker's counters do not linger. A process
    # without one writes pid-PID, removed by the next reader once that pid is
    # gone. Every record names its pid and the pid's start time, and a reader
    # keeps only records whose process is alive and is the same process (a
    # reused pid has another start time), so a dead pid never reaches a scrape.
    #
    # Writes are atomic (a temporary file renamed over the old one): a reader
    # sees the old record or the new one, never half of one.
    class Store
      # Where a server's workers and its scrapers meet unless told otherwise:
      # per user (mode 0700) and per master pid.
      def self.default_dir(master_pid)
        File.join(Dir.tmpdir, "memkit-metrics-#{Process.uid}", master_pid.to_s)
      end

      # The start time of a process in clock ticks since boot (field 22 of
      # /proc/PID/stat): with the pid, it names one process for good.
      def self.start_time(pid, root: "/proc")
        stat = File.read("#{root}/#{pid}/stat")
        Integer(stat[(stat.rindex(")") + 2)..].split(" ", 21)[19], 10)
      rescue SystemCallError, ArgumentError, TypeError, NoMethodError
        nil
      end

      attr_reader :dir

      def initialize(dir)
        @dir = dir.to_s
        raise InvalidArgument, "Memkit::Metrics dir: expected a directory path, got #{dir.inspect}" if @dir.empty?
      end

      # record: {pid:, role:, worker:, ...numbers}. Creates the directory (and
      # its per-user parent) on first use.
      def write(record)
        ensure_dir
        name = record[:worker].nil? ? "pid-#{record.fetch(:pid)}" : "worker-#{Integer(record[:worker])}"
        path = File.join(@dir, name)
        tmp = "#{path}.#{Process.pid}.tmp"
        record = record.compact
        record[:start] ||= self.class.start_time(record.fetch(:pid))
        File.write(tmp, self.class.dump(record))
        File.rename(tmp, path)
        path
      rescue SystemCallError => e
        File.unlink(tmp) if tmp && File.exist?(tmp)
        raise Error, "cannot write metrics record to #{@dir}: #{e.message}"
      end

      # {pid => record} for the records whose process is alive and is the one
      # that wrote it. A missing directory is an empty store.
      def read(root: "/proc")
        Dir.children(@dir).each_with_object({}) do |name, records|
          next unless name.match?(/\A(worker-\d+|pid-\d+)\z/)

          path = File.join(@dir, name)
          record = self.class.load(File.read(path))
          pid = record[:pid]
          if pid && record[:start] && self.class.start_time(pid, root: root) == record[:start]
            records[pid] = record
          elsif name.start_with?("pid-")
            File.unlink(path) # its writer is gone and nothing else writes that name
          end
        rescue SystemCallError, ParseError
          next # replaced or removed meanwhile, or not ours to read
        end
      rescue Errno::ENOENT, Errno::ENOTDIR
        {}
      rescue SystemCallError => e
        raise Error, "cannot read metrics records in #{@dir}: #{e.message}"
      end

      # One "key value" line per field: integers, floats and words.
      def self.dump(record)
        record.map do |key, value|
          raise ArgumentError, "metrics record #{key}: #{value.inspect} has a space" if value.to_s.match?(/\s/)

          "#{key} #{value}\n"
        end.join
      end

      def self.load(text)
        text.each_line.each_with_object({}) do |line, record|
          key, value = line.chomp.split(" ", 2)
          raise ParseError, "metrics record: bad line #{line.inspect}" unless key&.match?(/\A\w+\z/) && value

          record[key.to_sym] =
            case value
            when /\A-?\d+\z/ then Integer(value, 10)
            when /\A-?\d+\.\d+(e-?\d+)?\z/ then Float(value)
            else value
            end
        end
      end

      private

      # Created 0700, and it must be a real directory owned by this user (as
      # must the per-user parent of the default layout): another user must not
      # be able to plant records, or a symlink, in a shared /tmp.
      def ensure_dir
        FileUtils.mkdir_p(@dir, mode: 0o700)
        checked = [@dir]
        parent = File.dirname(@dir)
        checked << parent if File.basename(parent).start_with?("memkit-metrics-")
        checked.each do |d|
          st = File.lstat(d)
          next if st.directory? && st.owned?

          raise Error, "#{d} is not a directory owned by uid #{Process.uid}: not writing metrics there"
        end
      end
    end
  end
end
