# frozen_string_literal: true

require "test_helper"
require "fileutils"

# script/chroot-ruby's first build, driven end to end into a temporary cache
# folder (MEMKIT_RUBY33_ROOT / MEMKIT_RUBY34_ROOT) with stand-ins for the three
# commands that would touch the system: debootstrap (makes a tiny root with the
# Ruby binary the recipe expects, and says where its output went), chroot
# (logs what it was asked) and unshare (records the command it would enter,
# so nothing is mounted). The real cache, /var/cache/memkit, is never used.
class ChrootRubyTest < Minitest::Test
  SCRIPT = File.join(Memkit::TestHelpers::ROOT, "script/chroot-ruby")

  def setup
    @dir = Dir.mktmpdir("memkit-chroot-test")
    @bin = File.join(@dir, "bin")
    FileUtils.mkdir_p(@bin)
    stub("debootstrap", <<~SH)
      # debootstrap --variant=minbase --include=PKGS SUITE TARGET MIRROR
      target=$4
      echo "stub debootstrap: $*"
      stdout=$(readlink /proc/$$/fd/1)
      echo "$stdout" > "$STUB_DIR/debootstrap.stdout"
      [ "$STUB_FAIL" = debootstrap ] && { echo "E: Couldn't download packages: ruby$STUB_RUBY"; exit 1; }
      mkdir -p "$target/usr/bin" "$target/usr/local/bin" "$target/etc/apt/sources.list.d" "$target/etc/ssl/certs"
      exit 0
    SH
    stub("chroot", <<~SH)
      echo "stub chroot: $*"
      # The 3.4 recipe installs its Ruby from experimental inside the new root.
      case "$*" in
        *"install"*"ruby$STUB_RUBY"*) : > "$1/usr/bin/ruby$STUB_RUBY"; chmod +x "$1/usr/bin/ruby$STUB_RUBY" ;;
      esac
      exit 0
    SH
    stub("unshare", <<~SH)
      printf '%s\\n' "$@" > "$STUB_DIR/unshare.args"
      exit 0
    SH
  end

  def teardown
    FileUtils.rm_rf(@dir)
  end

  def test_a_successful_33_build_leaves_the_root_and_no_partial_log
    root = File.join(@dir, "cache", "ruby3.3-trixie")
    # The 3.3 recipe gets its Ruby from debootstrap's --include list.
    File.write(File.join(@bin, "debootstrap"), File.read(File.join(@bin, "debootstrap")).sub(
      "exit 0\n", "touch \"$target/usr/bin/ruby3.3\"; chmod +x \"$target/usr/bin/ruby3.3\"\nexit 0\n"
    ))
    out, err, status = build("3.3", "MEMKIT_RUBY33_ROOT" => root)
    assert status.success?, "script/chroot-ruby 3.3 failed:\n#{out}#{err}"
    assert_built(root, "3.3")
  end

  def test_a_successful_34_build_leaves_the_root_and_no_partial_log
    root = File.join(@dir, "cache", "ruby3.4-sid")
    out, err, status = build("3.4", "MEMKIT_RUBY34_ROOT" => root)
    assert status.success?, "script/chroot-ruby 3.4 failed:\n#{out}#{err}"
    assert_built(root, "3.4")
    assert_path_exists File.join(root, "etc/apt/sources.list.d/experimental.list")
  end

  def test_a_failed_build_shows_the_log_keeps_it_and_leaves_no_root
    root = File.join(@dir, "cache", "ruby3.3-trixie")
    out, err, status = build("3.3", "MEMKIT_RUBY33_ROOT" => root, "STUB_FAIL" => "debootstrap")
    refute status.success?, "a failed debootstrap must fail the build:\n#{out}#{err}"
    assert_equal 1, status.exitstatus
    assert_match(/E: Couldn't download packages: ruby3\.3/, err, "the log's tail goes to stderr")
    assert_match(/E: Couldn't download packages/, File.read("#{root}.partial.log"), "the log stays to be read")
    refute_path_exists File.join(root, "usr/bin/ruby3.3")
    refute_path_exists File.join(@dir, "unshare.args"), "nothing runs without a root"
  end

  private

  def stub(name, body)
    path = File.join(@bin, name)
    File.write(path, "#!/bin/sh\n#{body}")
    File.chmod(0o755, path)
  end

  def build(version, env)
    env = env.merge("PATH" => "#{@bin}:#{ENV.fetch('PATH')}", "STUB_DIR" => @dir, "STUB_RUBY" => version)
    Open3.capture3(env, "bash", SCRIPT, version, "ruby", "-v")
  end

  def assert_built(root, version)
    # debootstrap wrote into the partial log while the build ran...
    assert_equal "#{root}.partial.log", File.read(File.join(@dir, "debootstrap.stdout")).chomp
    # ...and a finished build leaves the root and neither the partial root nor its log.
    assert File.executable?(File.join(root, "usr/bin/ruby#{version}")), "the root has ruby#{version}"
    assert_equal "ruby#{version}", File.readlink(File.join(root, "usr/bin/ruby"))
    refute_path_exists "#{root}.partial"
    refute_path_exists "#{root}.partial.log"
    assert_equal [], Dir.children(File.dirname(root)) - [File.basename(root)]
    # Then it enters the new root with the command.
    args = File.readlines(File.join(@dir, "unshare.args"), chomp: true)
    assert_includes args, root
    assert_equal %w[ruby -v], args.last(2)
  end
end
