# frozen_string_literal: true

require "test_helper"

# Recorded /proc files, mutated 10,000 times: the parsers either return a
# reading or raise a Memkit::Error, never anything else.
class FuzzTest < Minitest::Test
  FIXTURES = File.join(ROOT, "test/fixtures/proc")
  PARSERS = {
    "smaps_rollup" => ->(text) { Memkit::Memory.parse(text) },
    "smaps" => lambda { |text|
      Memkit::Memory.parse(text)
      Memkit::Mappings.new(Memkit::Mappings.parse(text)).groups
    },
    "status" => ->(text) { Memkit::Status.parse(text) },
    "statm" => ->(text) { Memkit::Statm.parse(text) }
  }.freeze
  RUNS = 10_000

  def mutate(text, random)
    bytes = text.b
    random.rand(1..4).times do
      at = random.rand(bytes.bytesize + 1)
      case random.rand(9)
      when 0 then bytes = bytes[0, at] # truncated read
      when 1 then bytes.insert(at, random.bytes(random.rand(1..8)))
      when 2 then bytes.setbyte(at % [bytes.bytesize, 1].max, random.rand(256)) unless bytes.empty?
      when 3 then bytes = bytes.lines.tap { |l| l.delete_at(random.rand(l.size)) unless l.empty? }.join
      when 4 then bytes = bytes.lines.tap { |l| l.insert(random.rand(l.size + 1), l.sample(random: random).to_s) }.join
      when 5 then bytes = bytes.gsub(/\d+/) { |d| random.rand(4).zero? ? "9" * random.rand(1..40) : d }
      when 6 then bytes = bytes.sub(/\d/, %w[- x \xFF] .sample(random: random).b)
      when 7 then bytes = bytes.tr(random.rand(2).zero? ? ":" : " ", random.rand(2).zero? ? "\t" : "")
      else bytes = +""
      end
      bytes = bytes.b # Array#join of no lines gives US-ASCII; keep mutating bytes
    end
    random.rand(2).zero? ? bytes : bytes.dup.force_encoding(Encoding::UTF_8)
  end

  def test_only_memkit_errors_escape_the_parsers
    seed = Integer(ENV.fetch("FUZZ_SEED", Random.new_seed % 1_000_000))
    random = Random.new(seed)
    inputs = PARSERS.keys.to_h { |name| [name, File.binread(File.join(FIXTURES, name))] }
    outcomes = Hash.new(0)
    RUNS.times do |i|
      name = PARSERS.keys[i % PARSERS.size]
      input = mutate(inputs.fetch(name), random)
      begin
        PARSERS.fetch(name).call(input)
        outcomes[:parsed] += 1
      rescue Memkit::Error
        outcomes[:rejected] += 1
      rescue StandardError => e
        flunk "FUZZ_SEED=#{seed} run #{i}: #{name} parser raised #{e.class}: #{e.message}\ninput: #{input.inspect[0, 400]}"
      end
    end
    assert_equal RUNS, outcomes.values.sum
    # Both sides exercised: mutations that still parse, and ones rejected.
    assert_operator outcomes[:parsed], :>, RUNS / 10
    assert_operator outcomes[:rejected], :>, RUNS / 10
  end

  def test_the_unmutated_fixtures_parse
    PARSERS.each_key { |name| PARSERS.fetch(name).call(File.read(File.join(FIXTURES, name))) }
    assert_equal 2000 * 1024, Memkit::Memory.parse(File.read(File.join(FIXTURES, "smaps_rollup"))).rss
  end

  # Processes named with control characters, ANSI escapes, invalid UTF-8 and
  # bidi overrides, in argv[0] (the command line) and in comm: tree, cow and
  # smaps print them escaped, one row per process, nothing raw reaching the
  # terminal. Real processes: a small master spawns the children and waits.
  NASTY = ["a\nb", "tab\there", "\e[31mred\e[0m", "\e]0;title\a", "nul\u0001x", "del\x7fx", "\xff\xfebad",
           "\u202erev", "cr\rreturn", "back\\slash"].map(&:b).freeze

  def test_command_names_with_control_characters_are_printed_escaped
    require "memkit/cli"
    random = Random.new(19)
    names = NASTY + Array.new(6) { Array.new(random.rand(1..12)) { random.rand(1..255).chr }.join.b }
    names = names.map { |n| n.delete("\0") }.reject(&:empty?)
    master_script = <<~RUBY
      child = "begin; File.binwrite('/proc/self/comm', ARGV[0][0, 15]); rescue SystemCallError; end; puts; STDOUT.flush; sleep"
      pids = ARGV.map { |n| Process.spawn([#{RbConfig.ruby.dump}, n], "-e", child, n) }
      STDOUT.puts pids.join(" ")
      STDOUT.flush
      sleep
    RUBY
    IO.popen([RbConfig.ruby, "-e", master_script, *names], "r", pgroup: true) do |io|
      master = io.pid
      children = io.gets.split.map(&:to_i)
      children.size.times { io.gets } # each child wrote its comm
      outputs = {
        "tree" => cli("tree", master), "cow" => cli("cow", master, "--estimate"),
        "smaps" => children.map { |c| cli("smaps", c) }.join
      }
      outputs.each do |command, out|
        refute_match(/[\x00-\x09\x0b-\x1f\x7f]/, out, "#{command}: no raw control character")
        refute_match(/[\u0080-\u009f\u202a-\u202e]/, out.dup.force_encoding(Encoding::UTF_8).scrub, "#{command}: no C1 or bidi")
        names.each { |n| assert_includes out, Memkit::CLI.printable(n)[0, 20], "#{command}: #{n.inspect} shown escaped" }
      end
      rows = outputs["tree"].lines.grep(/^\s*\d+\s+\d+\s/)
      assert_equal children.size + 1, rows.size, "tree: one row per process\n#{outputs['tree']}"
      rows = outputs["cow"].lines.grep(/^\s*\d+\s/)
      assert_equal children.size, rows.size, "cow: one row per worker\n#{outputs['cow']}"
      assert_equal children.size, outputs["smaps"].scan(/^Command line: /).size
    ensure
      Process.kill(:KILL, -io.pid) # the master's own process group: it and its children
    end
  end

  private

  def cli(*argv)
    out = StringIO.new
    err = StringIO.new
    status = Memkit::CLI.new(out: out, err: err).run(argv.map(&:to_s))
    assert_equal [0, ""], [status, err.string], argv.inspect
    out.string
  end
end
