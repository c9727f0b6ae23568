# frozen_string_literal: true

require "test_helper"

# RackDriver shares one template env between requests for speed; what each
# request sees must still be what a server gives it: empty callback arrays,
# an empty input, no keys left by the previous request, its own callbacks run
# once, and non-Array bodies iterated and closed.
class SoakRackDriverTest < Minitest::Test
  def test_each_request_gets_a_fresh_rack_env
    driver = Memkit::Soak::RackDriver.new(File.expand_path("../fixtures/soak/rack_contract.ru", __dir__))
    driver.drive(6)
    log = Object.const_get(:LOG)

    requests = log.select { |e| e.first == :request }
    assert_equal (1..6).map { |n| [:request, n, 0, 0, "", false] }, requests
    assert_equal [1, 3, 5], log.select { |e| e.first == :after_reply }.map { |e| e[1] }
    assert_equal [[:finished, 3, 200, true], [:finished, 6, 200, true]], log.select { |e| e.first == :finished }
    assert_equal [2, 4, 6], log.select { |e| e.first == :closed }.map { |e| e[1] }
    # Each callback runs after its own request, before the next one starts.
    assert_operator log.index([:after_reply, 1]), :<, log.index { |e| e[0..1] == [:request, 2] }
  ensure
    Object.send(:remove_const, :LOG) if Object.const_defined?(:LOG)
  end
end
