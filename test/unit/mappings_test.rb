# frozen_string_literal: true

require "test_helper"

class MappingsTest < Minitest::Test
  FIXTURE = File.join(ROOT, "test/fixtures/proc/smaps")

  # Runs Ruby code in a new process (not a fork: a fork inherits this
  # process's thread stacks, which glibc then reuses for new threads) and
  # returns that process's mapping groups.
  def groups_in_new_process(setup = "nil")
    script = "keep = (#{setup}); print Marshal.dump(Memkit.mappings.to_h)"
    out, status = Open3.capture2(RbConfig.ruby, "-I#{File.join(ROOT, 'lib')}", "-rmemkit", "-e", script)
    assert status.success?
    Marshal.load(out)
  end

  def test_thread_stacks_are_stacks
    base = groups_in_new_process
    threads = groups_in_new_process(<<~RUBY)
      queue = Queue.new
      Array.new(6) { Thread.new { queue << :up; sleep } }.tap { 6.times { queue.pop } }
    RUBY
    assert_operator threads[:stacks][:count] - base[:stacks][:count], :>=, 6
  end

  def test_fiber_stacks_are_stacks
    base = groups_in_new_process
    # More live fibers than Ruby's first fiber-pool allocation holds.
    fibers = groups_in_new_process("Array.new(300) { Fiber.new { Fiber.yield }.tap(&:resume) }")
    assert_operator fibers[:stacks][:count] - base[:stacks][:count], :>=, 100
    assert_operator fibers[:guard][:count], :>, base[:guard][:count]
    assert_equal 0, fibers[:guard][:rss], "guard pages are never resident"
  end

  def test_a_large_allocation_is_anonymous_memory
    base = groups_in_new_process
    big = groups_in_new_process('"x" * (48 * 1024 * 1024)')
    assert_operator big[:anonymous][:rss] - base[:anonymous][:rss], :>=, 40 * 1024 * 1024
  end

  # Shapes seen on Ruby 3.3 / glibc 2.41: one malloc arena's PROT_NONE
  # reserve (megabytes) ends where the next arena begins, while a thread
  # stack sits above a single guard page.
  def test_an_arena_above_another_arenas_reserve_is_not_a_stack
    field = ->(kb) { %w[Size Rss Pss Private_Dirty Swap].map { |k| "#{k}: #{k == 'Size' ? kb : 0} kB\n" }.join }
    text = [
      "7ff330021000-7ff334000000 ---p 00000000 00:00 0 \n", field.(65_404),
      "7ff334000000-7ff334021000 rw-p 00000000 00:00 0 \n", field.(132),
      "7ff33ed7d000-7ff33ed7e000 ---p 00000000 00:00 0 \n", field.(4),
      "7ff33ed7e000-7ff33ee7e000 rw-p 00000000 00:00 0 \n", field.(1024)
    ].join
    groups = Memkit::Mappings.new(Memkit::Mappings.parse(text)).groups
    assert_equal [2, 1, 1], [groups[:guard].count, groups[:anonymous].count, groups[:stacks].count]
    assert_equal 1024 * 1024, groups[:stacks].size
  end

  # Shape seen on Ruby 3.4 / glibc 2.43 / Linux 6.18: thread stacks guarded
  # with MADV_GUARD_INSTALL are single rw-p mappings flagged "gu", side by
  # side with no PROT_NONE mapping between them; an arena is not flagged.
  def test_a_mapping_with_a_guard_region_is_a_stack
    field = lambda do |kb, flags|
      "Size: #{kb} kB\nRss: 8 kB\nPss: 8 kB\nPrivate_Dirty: 8 kB\nSwap: 0 kB\nVmFlags: #{flags} \n"
    end
    text = [
      "7f8c2c000000-7f8c2c021000 rw-p 00000000 00:00 0 \n", field.(132, "rd wr mr mw me ac"),
      "7f8c30949000-7f8c30a4a000 rw-p 00000000 00:00 0 \n", field.(1028, "rd wr mr mw me gu ac nh"),
      "7f8c30a4a000-7f8c30b4b000 rw-p 00000000 00:00 0 \n", field.(1028, "rd wr mr mw me ac"),
      "7f8c30b4b000-7f8c30c4c000 rw-p 00000000 00:00 0 \n", field.(1028, "rd wr mr mw me gu ac nh")
    ].join
    mappings = Memkit::Mappings.parse(text)
    assert_equal [false, true, false, true], mappings.map(&:guard_region?)
    groups = Memkit::Mappings.new(mappings).groups
    assert_equal [2, 2, 0], [groups[:anonymous].count, groups[:stacks].count, groups[:guard].count]
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
