# frozen_string_literal: true

require "test_helper"

class MappingsTest < Minitest::Test
  FIXTURE = File.expand_path("../fixtures/proc/smaps", __dir__)

  # Runs the block in a fresh child and returns its mappings' groups.
  def groups_in_child(&setup)
    reader, writer = IO.pipe
    pid = fork do
      reader.close
      keep = setup&.call
      writer.write(Marshal.dump(Memkit.mappings.to_h))
      keep # held alive until the reading above is done
      exit!(0)
    end
    writer.close
    Marshal.load(reader.read) # rubocop:disable Security/MarshalLoad
  ensure
    Process.wait(pid) if pid
  end

  def test_thread_stacks_are_stacks
    base = groups_in_child
    threads = groups_in_child do
      queue = Queue.new
      started = Array.new(6) { Thread.new { queue << :up; sleep } }
      6.times { queue.pop }
      started
    end
    assert_operator threads[:stacks][:count] - base[:stacks][:count], :>=, 6
  end

  def test_fiber_stacks_are_stacks
    base = groups_in_child
    fibers = groups_in_child do
      # More live fibers than Ruby's first fiber-pool allocation holds.
      Array.new(300) { Fiber.new { Fiber.yield }.tap(&:resume) }
    end
    assert_operator fibers[:stacks][:count] - base[:stacks][:count], :>=, 100
    assert_operator fibers[:guard][:count], :>, base[:guard][:count]
    assert_equal 0, fibers[:guard][:rss], "guard pages are never resident"
  end

  def test_a_large_allocation_is_anonymous_memory
    base = groups_in_child
    big = groups_in_child { "x" * (48 * 1024 * 1024) }
    assert_operator big[:anonymous][:rss] - base[:anonymous][:rss], :>=, 40 * 1024 * 1024
  end

  def test_libraries_and_kernel_mappings
    groups = Memkit.mappings.groups
    assert_operator groups[:libraries].count, :>, 1
    assert_operator groups[:libraries].rss, :>, 0
    assert_operator groups[:kernel].count, :>=, 1
    assert_equal Memkit::Mappings::KINDS.keys, groups.keys
  end

  # Every mapping lands in exactly one group: the groups add up to the whole.
  def test_groups_add_up_to_the_process_totals
    text = File.read(FIXTURE)
    mappings = Memkit::Mappings.new(Memkit::Mappings.parse(text))
    total = Memkit::Memory.parse(text)
    assert_equal total.rss, mappings.groups.values.sum(&:rss)
    assert_equal total.pss, mappings.groups.values.sum(&:pss)
    assert_equal total.private_dirty, mappings.groups.values.sum(&:private_dirty)
    assert_equal mappings.mappings.size, mappings.groups.values.sum(&:count)
  end

  def test_missing_process
    gone = fork { exit!(0) }
    Process.wait(gone)
    assert_raises(Memkit::NoSuchProcess) { Memkit.mappings(gone) }
  end
end
