# frozen_string_literal: true

module Memkit
  # The fields of /proc/PID/status that memkit uses, sizes in bytes.
  # RssAnon/RssFile/RssShmem exist since Linux 4.5; where missing they are nil.
  Status = Struct.new(:pid, :name, :ppid, :threads, :vm_size, :vm_rss, :vm_hwm,
                      :rss_anon, :rss_file, :rss_shmem, :vm_swap, keyword_init: true) do
    def self.read(pid, root: "/proc")
      parse(ProcFS.read(pid, "status", root: root), "/proc/#{pid}/status")
    end

    def self.parse(text, file = "status")
      text = ProcFS.binary(text)
      raw = text.scan(/^(\w+):[ \t]*(.*)$/).to_h
      kb = ProcFS.kb_fields(text)
      get = ->(key) { raw.fetch(key) { raise ParseError, "#{file}: no #{key} field" } }
      int = ->(key) { Integer(get.(key), 10) }
      # Kernel threads and zombies have no Vm* lines: their memory is zero.
      new(pid: int.("Pid"), name: get.("Name").dup.force_encoding(Encoding::UTF_8).scrub,
          ppid: int.("PPid"), threads: int.("Threads"),
          vm_size: kb.fetch("VmSize", 0), vm_rss: kb.fetch("VmRSS", 0), vm_hwm: kb.fetch("VmHWM", 0),
          rss_anon: kb["RssAnon"], rss_file: kb["RssFile"], rss_shmem: kb["RssShmem"],
          vm_swap: kb.fetch("VmSwap", 0)).freeze
    rescue ArgumentError, TypeError => e
      raise ParseError, "#{file}: #{e.message}"
    end
  end

  # /proc/PID/statm: seven page counts, the cheapest memory reading there is.
  Statm = Struct.new(:size, :resident, :shared, :text, :data, keyword_init: true) do
    def self.read(pid, root: "/proc")
      parse(ProcFS.read(pid, "statm", root: root), "/proc/#{pid}/statm")
    end

    def self.parse(text, file = "statm")
      pages = ProcFS.binary(text).split
      raise ParseError, "#{file}: expected 7 numbers, got #{text.inspect[0, 60]}" unless pages.size == 7

      size, resident, shared, code, _lib, data, = pages.map { |n| Integer(n, 10) * ProcFS::PAGE_SIZE }
      new(size: size, resident: resident, shared: shared, text: code, data: data).freeze
    rescue ArgumentError => e
      raise ParseError, "#{file}: #{e.message}"
    end
  end
end
