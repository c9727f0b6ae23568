# frozen_string_literal: true

require "test_helper"
require "memkit/out_of_band"

# The registry behind Puma's out_of_band hook (`plugin :memkit`).
class OobGCOutOfBandTest < Minitest::Test
  OutOfBand = Memkit::OutOfBand

  def teardown
    %i[first second third].each { |name| OutOfBand.unregister(name) }
  end

  def test_runs_handlers_in_order_and_stops_at_stop
    calls = []
    OutOfBand.register(:second, order: 20) { calls << :second }
    OutOfBand.register(:first, order: 10) { calls << :first }
    OutOfBand.register(:third, order: 30) { calls << :third }
    ran = OutOfBand.run
    assert_equal %i[first second third], calls & %i[first second third]
    assert_equal ran & %i[first second third], %i[first second third]

    calls.clear
    OutOfBand.register(:second, order: 20) { calls << :second and :stop }
    OutOfBand.run
    assert_equal %i[first second], calls & %i[first second third], "a worker that is going runs nothing more"
  end

  def test_registering_a_name_again_replaces_its_handler
    calls = []
    OutOfBand.register(:first) { calls << 1 }
    OutOfBand.register(:first) { calls << 2 }
    OutOfBand.run
    assert_equal [2], calls
    assert OutOfBand.unregister(:first)
    refute OutOfBand.registered?(:first)
  end

  # Set by `plugin :memkit` in Puma's master; its workers inherit it.
  def test_installed_is_inherited_by_forked_workers
    reader, writer = IO.pipe
    pid = fork do
      before = OutOfBand.installed?
      OutOfBand.installed!
      child = fork { writer.write("#{before} #{OutOfBand.installed?}") and exit!(0) }
      Process.wait(child)
      exit!(0)
    end
    writer.close
    Process.wait(pid)
    assert_equal "false true", reader.read
  end

  def test_hooked_only_in_the_process_where_the_hook_ran
    OutOfBand.run
    assert OutOfBand.hooked?
    reader, writer = IO.pipe
    pid = fork do
      writer.write(OutOfBand.hooked? ? "yes" : "no")
      exit!(0)
    end
    writer.close
    Process.wait(pid)
    assert_equal "no", reader.read
  end
end
