# frozen_string_literal: true

require "test_helper"
require "memkit/cli"
require "memkit/cli/tree"

# memkit tree's line about the container: the tree's PSS against the memory
# cgroup's limit, from made-up readings.
class CLITreeTest < Minitest::Test
  Tree = Struct.new(:total_pss)

  def reading(limit:, usage: 3 << 30)
    Memkit::Cgroup::Reading.new(version: 2, path: "/sys/fs/cgroup/app.slice", limit: limit, high: nil,
                                usage: usage, inactive_file: 0, events: {}, limited_at: nil)
  end

  def test_a_limited_container_gives_the_trees_share_of_the_limit
    line = Memkit::CLI::Tree.container_note(Tree.new(1 << 30), reading(limit: 4 << 30))
    assert_equal "container: the tree's pss is 25% of the 4.0 GiB limit (cgroup v2 /sys/fs/cgroup/app.slice); " \
                 "usage 3.0 GiB with page cache.", line
  end

  def test_no_limit_says_so
    line = Memkit::CLI::Tree.container_note(Tree.new(1 << 30), reading(limit: nil))
    assert_match(/\Acontainer: no memory limit \(cgroup v2 /, line)
  end

  def test_the_real_cgroup_of_this_process_is_read_or_absent
    reading = Memkit::CLI::Tree.container(Process.pid)
    skip "no memory cgroup on this machine" unless reading
    assert_kind_of Integer, reading.usage
  end
end
