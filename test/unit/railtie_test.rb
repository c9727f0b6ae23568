# frozen_string_literal: true

require "test_helper"

# memkit/railtie is loaded only where Rails is; bench/rails (its own Gemfile)
# runs it under real Unicorn and Puma (bench/cow_rails.rb).
class RailtieTest < Minitest::Test
  def test_without_rails_requiring_it_names_what_is_missing
    begin
      require "rails/railtie"
      skip "railties is loadable in this bundle; bench/rails exercises the Railtie itself"
    rescue LoadError
      nil
    end
    error = assert_raises(Memkit::Unsupported) { load File.join(ROOT, "lib/memkit/railtie.rb") }
    assert_match(/needs Rails/, error.message)
    assert_match(/Memkit\.warmup\(app:, requests:\)/, error.message)
  end
end
