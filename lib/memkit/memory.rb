# frozen_string_literal: true

module Memkit
  # One process's memory as the kernel accounts it, in bytes.
  #
  # rss counts every resident page once per process that maps it, so summing
  # rss over a forked tree counts shared pages again for every worker. pss
  # splits each shared page between its sharers and sums to the true total;
  # uss (private_clean + private_dirty) is what killing the process frees.
  Memory = Struct.new(:rss, :pss, :shared_clean, :shared_dirty,
                      :private_clean, :private_dirty, :swap, keyword_init: true) do
    def uss
      private_clean + private_dirty
    end

    def shared
      shared_clean + shared_dirty
    end

    def to_h
      super.merge(uss: uss, shared: shared)
    end
  end

  class Memory
    FIELDS = {
      rss: "Rss", pss: "Pss", shared_clean: "Shared_Clean", shared_dirty: "Shared_Dirty",
      private_clean: "Private_Clean", private_dirty: "Private_Dirty", swap: "Swap"
    }.freeze

    # A kernel thread's memory: it has no user address space, and its smaps
    # files answer ESRCH as if it did not exist.
    NONE = new(**FIELDS.transform_values { 0 }).freeze

    # smaps_rollup (Linux 4.14+) has the totals in one read; older kernels get
    # the same numbers by summing every mapping in smaps, which is much slower.
    # A kernel thread reads as NONE (all zero), not as a missing process.
    def self.read(pid, source: :auto, root: "/proc")
      read_smaps(pid, source, root)
    rescue NoSuchProcess
      raise unless ProcFS.kernel_thread?(pid, root: root)

      NONE
    end

    def self.read_smaps(pid, source, root)
      text =
        if source == :smaps
          ProcFS.read(pid, "smaps", root: root)
        else
          begin
            ProcFS.read(pid, "smaps_rollup", root: root)
          rescue Unsupported
            raise if source == :smaps_rollup

            ProcFS.read(pid, "smaps", root: root)
          end
        end
      # A zombie, or a process that exited mid-read, has no mm: the file reads empty.
      raise NoSuchProcess, "pid #{pid} exited while its memory was read" if text.empty?

      parse(text, "/proc/#{pid}/#{source == :smaps ? 'smaps' : 'smaps_rollup'}")
    end
    private_class_method :read_smaps

    # Parses smaps_rollup, or a whole smaps file (whose mappings are summed).
    def self.parse(text, file = "smaps")
      fields = ProcFS.kb_fields(text)
      new(**FIELDS.transform_values do |key|
        fields.fetch(key) { raise ParseError, "#{file}: no #{key} field" }
      end).freeze
    end
  end
end
