# frozen_string_literal: true

require "test_helper"

# RackDriver shares one template env between requests for speed; what each
# request sees must still be what a server gives it: empty callback arrays,
# an empty input, no keys left by the previous request, its own callbacks run
# once, and non-Array bodies iterated and closed.
module SoakRackDriverTests
  def driver(path) = Memkit::Soak::RackDriver.new(path)

  def test_each_request_gets_a_fresh_rack_env
    driver(File.join(Memkit::TestHelpers::ROOT, "test/fixtures/soak/rack_contract.ru")).drive(10)
    log = Object.const_get(:LOG)

    requests = log.select { |e| e.first == :request }
    assert_equal (1..10).map { |n| [:request, n, 0, 0, "", false] }, requests
    assert_equal [1, 3, 5], log.select { |e| e.first == :after_reply }.map { |e| e[1] }
    assert_equal [3, 6, 9].map { |n| [:finished, n, 200, true] }, log.select { |e| e.first == :finished }
    assert_equal [2, 4, 6, 7, 8, 10], log.select { |e| e.first == :closed }.map { |e| e[1] }
    # Each callback runs after its own request, before the next one starts.
    assert_operator log.index([:after_reply, 1]), :<, log.index { |e| e[0..1] == [:request, 2] }
  ensure
    Object.send(:remove_const, :LOG) if Object.const_defined?(:LOG)
  end

  def test_counts_requests_across_calls
    d = driver(File.join(Memkit::TestHelpers::ROOT, "bench/soak/hello.ru"))
    assert_equal 250, d.drive(250)
    assert_equal 1, d.drive(1)
    assert_equal 0, d.drive(0)
  end

  # The request that raised is named by its number since the driver started,
  # whether the app raised or the body did while being iterated.
  def test_names_the_request_that_raised
    Dir.mktmpdir do |dir|
      File.write(File.join(dir, "body.ru"), <<~RU)
        class RaisingBody
          def each = raise(IOError, "stream broke")
        end
        n = 0
        run ->(_env) { [200, {}, (n += 1) == 17 ? RaisingBody.new : ["ok"]] }
      RU
      File.write(File.join(dir, "app.ru"), <<~RU)
        n = 0
        run ->(_env) { (n += 1) == 1010 ? raise(ArgumentError, "bad request") : [200, {}, ["ok"]] }
      RU
      d = driver(File.join(dir, "body.ru"))
      d.drive(10)
      error = assert_raises(Memkit::Error) { d.drive(100) }
      assert_equal "body.ru: the app raised on request 17: IOError: stream broke", error.message

      d = driver(File.join(dir, "app.ru"))
      d.drive(1000)
      error = assert_raises(Memkit::Error) { d.drive(100) }
      assert_equal "app.ru: the app raised on request 1010: ArgumentError: bad request", error.message
    end
  end

  def test_a_response_that_is_not_a_triple_is_an_error
    Dir.mktmpdir do |dir|
      path = File.join(dir, "nil.ru")
      File.write(path, "run ->(_env) { nil }\n")
      error = assert_raises(Memkit::Error) { driver(path).drive(3) }
      assert_match(/\Anil\.ru: the app raised on request 1: NoMethodError/, error.message)
    end
  end
end

class SoakRackDriverTest < Minitest::Test
  include SoakRackDriverTests

  def test_a_directory_is_named_as_one
    Dir.mktmpdir do |dir|
      error = assert_raises(Memkit::InvalidArgument) { Memkit::Soak::RackDriver.new(dir) }
      assert_equal "#{dir} is a directory, not a config.ru", error.message
      File.write(File.join(dir, "config.ru"), "run ->(_env) { [200, {}, []] }\n")
      error = assert_raises(Memkit::InvalidArgument) { Memkit::Soak::RackDriver.new(dir) }
      assert_equal "#{dir} is a directory, not a config.ru: soak #{dir}/config.ru", error.message
      error = assert_raises(Memkit::InvalidArgument) { Memkit::Soak::RackDriver.new(File.join(dir, "nope.ru")) }
      assert_equal "no such file: #{dir}/nope.ru", error.message
    end
  end
end
