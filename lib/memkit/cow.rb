# frozen_string_literal: true

require_relative "../memkit"

module Memkit
  # How much of a master's memory each forked worker still shares with it.
  #
  # Exact where the kernel shows page frame numbers: /proc/PID/pagemap gives
  # the physical page behind each virtual page, and after fork a worker's
  # page is shared with its master exactly when both map the same frame at
  # the same address. Since Linux 4.0 the frame numbers read as zero without
  # CAP_SYS_ADMIN; then the figure falls back to an estimate, the worker's
  # Shared_Clean + Shared_Dirty from smaps (pages it shares with anyone, which
  # for a forked worker are nearly all its master's) over the master's rss.
  #
  # What the server costs is tree_pss (master + workers, each shared page
  # split between its sharers) and each worker's uss; shared_pct grows when
  # the master grows too, so it is read beside master_rss, never alone.
  class Cow
    PFN_MASK = (1 << 55) - 1
    PRESENT = 1 << 63
    CHUNK = 4096 # pagemap entries per read: 32 KiB

    Worker = Struct.new(:pid, :rss, :pss, :uss, :shared_with_master, :shared_pct, :private_dirty, :method,
                        keyword_init: true) do
      def to_h = super
    end

    attr_reader :master_pid, :master_rss, :master_pss, :master_private_dirty, :workers, :method

    # master: a pid; workers: pids, or nil for the master's direct children.
    # exact: :auto (pagemap when frame numbers are visible), true, or false.
    def self.read(master, workers = nil, exact: :auto, root: "/proc")
      unless [true, false, :auto].include?(exact)
        raise InvalidArgument, "exact: must be true, false or :auto, not #{exact.inspect}"
      end

      master = ProcFS.pid!(master)
      if ProcFS.kernel_thread?(master, root: root)
        name = Tree.command(master, root: root).delete("[]")
        raise KernelThread, "pid #{master} (#{name}) is a kernel thread: it has no user memory to share"
      end
      workers = workers ? workers.map { |w| ProcFS.pid!(w) } : children(master, root)
      new(master, workers, exact, root)
    end

    def self.children(pid, root = "/proc")
      ProcFS.children(root: root).fetch(pid, [])
    end

    def initialize(master, workers, exact, root)
      @master_pid = master
      @root = root
      master_memory = Memory.read(master, root: root)
      @master_private_dirty = master_memory.private_dirty
      @master_pss = master_memory.pss
      frames = exact == false ? nil : self.class.frames(master, root)
      frames = nil if frames && frames.all? { |_, _, e| e.none? { |v| v & PFN_MASK != 0 } }
      if exact == true && frames.nil?
        raise PermissionDenied, "/proc/#{master}/pagemap shows no page frame numbers (needs CAP_SYS_ADMIN)"
      end

      @method = frames ? :pagemap : :estimate
      @master_rss = if frames
                      frames.sum { |_, _, e| e.count { |v| v & PRESENT != 0 } } * ProcFS::PAGE_SIZE
                    else
                      master_memory.rss
                    end
      @workers = workers.filter_map { |pid| worker(pid, frames) }
      freeze
    end

    # Total PSS of the master and the workers read: the tree's real footprint.
    def tree_pss = master_pss + workers.sum(&:pss)

    def to_h
      { master: { pid: master_pid, rss: master_rss, pss: master_pss, private_dirty: master_private_dirty },
        tree_pss: tree_pss, method: method, workers: workers.map(&:to_h) }
    end

    # [[start, finish, entries]] for every mapping of pid; entries are raw
    # pagemap words, one per page.
    def self.frames(pid, root = "/proc")
      maps = ProcFS.read(pid, "maps", root: root)
      File.open("#{root}/#{pid}/pagemap", "rb") do |pagemap|
        maps.each_line.filter_map do |line|
          next if line.include?("[vsyscall]")

          range = line[0, line.index(" ")]
          start, finish = range.split("-").map { |h| h.to_i(16) }
          [start, finish, read_entries(pagemap, start, finish)]
        end
      end
    rescue SystemCallError => e
      raise ProcFS.translate(e, pid, "pagemap", root)
    end

    def self.read_entries(pagemap, start, finish)
      pages = (finish - start) / ProcFS::PAGE_SIZE
      first = start / ProcFS::PAGE_SIZE
      entries = []
      (0...pages).step(CHUNK) do |i|
        n = [CHUNK, pages - i].min
        data = pagemap.pread(n * 8, (first + i) * 8)
        entries.concat(data.unpack("Q*"))
      end
      entries
    rescue EOFError
      entries
    end

    private

    def worker(pid, master_frames)
      memory = Memory.read(pid, root: @root)
      shared =
        if master_frames
          common_pages(master_frames, self.class.frames(pid, @root)) * ProcFS::PAGE_SIZE
        else
          memory.shared
        end
      pct = master_rss.zero? ? 0.0 : [100.0 * shared / master_rss, 100.0].min
      Worker.new(pid: pid, rss: memory.rss, pss: memory.pss, uss: memory.uss, shared_with_master: shared,
                 shared_pct: pct.round(2),
                 private_dirty: memory.private_dirty, method: @method)
    rescue NoSuchProcess
      nil # a worker that exited while we read it is no longer part of the answer
    end

    # Pages present in both at the same address with the same frame.
    def common_pages(a, b)
      count = 0
      i = j = 0
      page = ProcFS::PAGE_SIZE
      while i < a.size && j < b.size
        a_start, a_end, a_entries = a[i]
        b_start, b_end, b_entries = b[j]
        lo = [a_start, b_start].max
        hi = [a_end, b_end].min
        if lo < hi
          ai = (lo - a_start) / page
          bi = (lo - b_start) / page
          ((hi - lo) / page).times do |k|
            x = a_entries[ai + k]
            next unless x && x & PRESENT != 0

            y = b_entries[bi + k]
            count += 1 if y && y & PRESENT != 0 && (y & PFN_MASK) == (x & PFN_MASK) && (x & PFN_MASK) != 0
          end
        end
        a_end <= b_end ? i += 1 : j += 1
      end
      count
    end
  end
end
