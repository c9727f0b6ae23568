# frozen_string_literal: true

require "rbconfig"

# A stand-in for a preforking server, in a Ruby process of its own: a master
# that builds a heap, forks workers that each write to part of it, and then
# everything sleeps so /proc holds still while tests read it.
module ServerTree
  SCRIPT = <<~'RUBY'
    workers, heap_strings, slices = ARGV.map(&:to_i)
    $heap = Array.new(heap_strings) { |i| "boot data string number #{i} " * 3 }
    GC.start
    ready_r, ready_w = IO.pipe
    workers.times do |n|
      fork do
        ready_r.close
        # Each worker writes one contiguous slice of the boot data, as a worker
        # that updates part of a cache would.
        per = $heap.size / slices
        $heap[n % slices * per, per].each { |s| s.setbyte(0, 66) }
        ready_w.write("w")
        sleep
      end
    end
    ready_w.close
    workers.times { ready_r.read(1) }
    # The master keeps working after fork too (its last slice), so it has
    # private memory of its own, as a real master does.
    per = $heap.size / slices
    $heap[(slices - 1) * per, per].each { |s| s.setbyte(1, 67) }
    $stdout.puts "ready"
    $stdout.flush
    sleep
  RUBY

  # Yields the master's pid once every worker has written its 1/slices of the heap.
  def self.run(workers: 3, heap_strings: 400_000, slices: 8)
    io = IO.popen([RbConfig.ruby, "-e", SCRIPT, workers.to_s, heap_strings.to_s, slices.to_s], "r", pgroup: true)
    raise "server tree did not start" unless io.gets == "ready\n"

    yield io.pid
  ensure
    if io
      Process.kill(:KILL, -io.pid) rescue nil # already gone is fine
      io.close
    end
  end
end
