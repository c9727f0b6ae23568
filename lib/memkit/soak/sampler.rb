# frozen_string_literal: true

module Memkit
  module Soak
    # One memory sample: requests served so far, seconds since the start and
    # the memory figures in bytes (nil where the mode cannot see them).
    Sample = Struct.new(:requests, :seconds, :rss, :heap_live_slots, :heap_live_bytes, :malloc_bytes, :gc,
                        keyword_init: true) do
      def to_h = super.compact
    end

    # Reads this process's memory: rss from statm, the Ruby heap from
    # GC.stat, and malloc'd bytes from MallocStats. #record writes one sample
    # into a SampleLog and keeps nothing itself, so sampling adds no live
    # memory of its own to the curve it measures.
    class SelfSampler
      attr_reader :malloc_source

      def initialize
        @malloc = MallocStats.new
        @malloc_source = @malloc.source
        # Ruby 3.2+ has size pools with slots of 40..640 bytes, and 3.3+
        # counts live objects per pool; without those counts every slot is
        # taken as RVALUE_SIZE (40 bytes on 64-bit), exact before 3.2.
        @pools = GC.respond_to?(:stat_heap) && GC.stat_heap(0).key?(:total_allocated_objects)
        @slot = GC::INTERNAL_CONSTANTS[:RVALUE_SIZE] || 40
        @pool_slots = @pools ? GC.stat_heap.to_h { |i, h| [i, h.fetch(:slot_size)] } : {}
      end

      def record(log, requests, seconds, gc:)
        log.record(requests, seconds, Memkit.rss, GC.stat(:heap_live_slots), heap_live_bytes, @malloc.bytes, gc)
      end

      def pid = Process.pid

      private

      # GC.stat_heap(pool, key) answers one Integer; the whole-table form
      # would build Hashes at every sample.
      def heap_live_bytes
        return GC.stat(:heap_live_slots) * @slot unless @pools

        @pool_slots.sum do |i, size|
          (GC.stat_heap(i, :total_allocated_objects) - GC.stat_heap(i, :total_freed_objects)) * size
        end
      end
    end

    # Reads a server's memory from outside: rss summed over the pid and all
    # its descendants (workers come and go; the tree is re-read each time).
    class TreeSampler
      attr_reader :pid

      def initialize(pid)
        @pid = ProcFS.pid!(pid)
        Memkit.rss(@pid) # fail now, naming the pid, if it is not there
      end

      def malloc_source = nil

      def record(log, requests, seconds, gc: false)
        log.record(requests, seconds, tree_rss, nil, nil, nil, gc)
      end

      private

      # statm per process, not smaps_rollup: a few microseconds each, so a
      # sample does not stall a busy server's workers.
      def tree_rss
        pids = [@pid, *descendants]
        pids.sum do |p|
          Memkit.rss(p)
        rescue NoSuchProcess
          raise if p == @pid

          0 # a worker that exited between listing and reading
        end
      end

      def descendants
        children = ProcFS.children
        out = []
        queue = [@pid]
        until queue.empty?
          kids = children.fetch(queue.shift, [])
          out.concat(kids)
          queue.concat(kids)
        end
        out
      end
    end
  end
end
