# frozen_string_literal: true

require "test_helper"

# script/check-installed: gem build, gem install into an empty GEM_HOME, then
# every command and --help from the installed gem, outside Bundler.
class InstalledGemTest < Minitest::Test
  def test_every_command_works_from_the_installed_gem
    out, status = Open3.capture2e({ "RUBYOPT" => nil, "RUBYLIB" => nil, "BUNDLE_GEMFILE" => nil },
                                  RbConfig.ruby, File.join(Memkit::TestHelpers::ROOT, "script/check-installed"))
    assert status.success?, "script/check-installed:\n#{out.lines.reject { |l| l.start_with?('ok ') }.join}"
    assert_match(/^check-installed: all passed$/, out)
    assert_operator out.lines.grep(/\Aok /).size, :>=, 30
  end
end
