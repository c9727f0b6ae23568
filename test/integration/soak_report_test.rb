# frozen_string_literal: true

require "test_helper"
require "json"
require "zlib"

# The SVG and HTML reports, and the HTML report rendered by a real browser:
# Debian's chromium in headless mode takes a screenshot, and the PNG's pixels
# are checked for the curve's colour across the plot's width.
class SoakReportTest < Minitest::Test
  FIXTURES = File.join(Memkit::TestHelpers::ROOT, "test", "fixtures", "soak")
  CHROMIUM = "/usr/bin/chromium"
  CURVE = [0xd6, 0x27, 0x28] # Chart::COLORS.first

  def test_svg_has_one_path_point_per_sample_and_the_fit
    Dir.mktmpdir do |dir|
      svg = File.join(dir, "leak.svg")
      out, err, status = memkit("soak", File.join(FIXTURES, "leak.ru"), "--requests", "2000", "--sample-every", "40",
                                "--no-attribute", "--json", "--plot", svg)
      assert status.success?, err
      samples = JSON.parse(out)["samples"]
      text = File.read(svg)
      assert text.start_with?("<svg xmlns=\"http://www.w3.org/2000/svg\"")
      curve = text[/<path class="curve"[^>]* d="([^"]+)"/, 1]
      points = curve.delete_prefix("M").split("L").map { |p| p.split.map(&:to_f) }
      assert_equal samples.size, points.size
      xs = points.map(&:first)
      assert_equal xs.sort, xs, "x grows with requests"
      # A leak goes up the page: the last point is higher (smaller y) than the first.
      assert_operator points.last[1], :<, points.first[1] - 100
      assert_match(/<path class="fit"/, text)
      refute_match(/(href|src)=/, text, "no external references")
    end
  end

  def test_html_report_renders_in_headless_chromium_with_the_curve
    skip "#{CHROMIUM} is not installed (apt-get install chromium): cannot check the HTML report in a browser" unless File.executable?(CHROMIUM)

    Dir.mktmpdir do |dir|
      html = File.join(dir, "report.html")
      out, err, status = memkit("soak", File.join(FIXTURES, "leak.ru"), "--requests", "2000", "--sample-every", "20",
                                "--no-attribute", "--plot", html)
      assert status.success?, err
      assert_match(/wrote #{Regexp.escape(html)}/, out)
      page = File.read(html)
      refute_match(/(href|src)=|<script|@import|url\(/, page, "self-contained: no external assets")

      png = File.join(dir, "shot.png")
      profile = File.join(dir, "profile")
      _o, log, st = Open3.capture3(CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                                   "--no-first-run", "--disable-background-networking", "--disable-component-update",
                                   "--disable-sync", "--user-data-dir=#{profile}", "--screenshot=#{png}",
                                   "--window-size=1000,800", "file://#{html}")
      assert st.success? && File.exist?(png), "chromium failed: #{log.lines.last(3).join}"
      width, height, pixels = decode_png(File.binread(png))
      assert_equal [1000, 800], [width, height]
      columns = Hash.new(0)
      pixels.each_with_index do |row, y|
        row.each_with_index do |(r, g, b), x|
          columns[x] += 1 if y < 560 && (r - CURVE[0]).abs < 40 && (g - CURVE[1]).abs < 40 && (b - CURVE[2]).abs < 40
        end
      end
      # The curve spans the plot from the first sample to the last (the plot
      # is 752 px wide at this window size); the legend swatch alone is 14 px.
      assert_operator columns.size, :>, 500, "curve colour found in only #{columns.size} columns"
      assert_operator columns.keys.max - columns.keys.min, :>, 700
      # A rising curve: red pixels near the top on the right, near the bottom on the left.
      left = rows_with_colour(pixels, 120..200)
      right = rows_with_colour(pixels, 780..860)
      assert_operator right.min, :<, left.max - 150, "the curve rises from left to right"
    end
  end

  def test_compare_overlays_a_second_curve_in_the_html
    Dir.mktmpdir do |dir|
      html = File.join(dir, "cmp.html")
      out, err, status = memkit("soak", File.join(FIXTURES, "churn.ru"), "--requests", "600", "--sample-every", "20",
                                "--no-attribute", "--json", "--plot", html, "--compare", "arena1:MALLOC_ARENA_MAX=1")
      assert status.success?, err
      r = JSON.parse(out)
      assert_equal "default", r["label"]
      assert_equal ["arena1"], r["compare"].map { |c| c["label"] }
      assert_equal 31, r["compare"].first["samples"].size
      page = File.read(html)
      assert_equal 2, page.scan('<path class="curve"').size
      assert_includes page, 'data-label="arena1"'
    end
  end

  def test_compare_under_jemalloc_reads_jemalloc_statistics
    lib = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
    skip "#{lib} missing (apt-get install libjemalloc2)" unless File.exist?(lib)

    out, err, status = memkit("soak", File.join(FIXTURES, "churn.ru"), "--requests", "400", "--sample-every", "20",
                              "--no-attribute", "--json", "--compare", "jemalloc:LD_PRELOAD=#{lib}")
    assert status.success?, err
    r = JSON.parse(out)
    refute_match(/jemalloc/, r["malloc_source"])
    assert_equal "jemalloc stats.allocated", r["compare"].first["malloc_source"]
  end

  private

  def rows_with_colour(pixels, xrange)
    pixels.each_with_index.select do |row, y|
      y < 560 && xrange.any? { |x| (r, g, b) = row[x]; (r - CURVE[0]).abs < 40 && (g - CURVE[1]).abs < 40 && (b - CURVE[2]).abs < 40 }
    end.map(&:last)
  end

  # Enough of PNG for a browser screenshot: 8-bit RGB or RGBA, not
  # interlaced. Returns [width, height, rows of [r, g, b]].
  def decode_png(data)
    assert_equal "\x89PNG\r\n\x1a\n".b, data[0, 8]
    pos = 8
    idat = +""
    width = height = channels = nil
    while pos < data.size
      len, type = data[pos, 8].unpack("Na4")
      body = data[pos + 8, len]
      case type
      when "IHDR"
        width, height, depth, color, _c, _f, interlace = body.unpack("NNCCCCC")
        assert_equal [8, 0], [depth, interlace]
        channels = { 2 => 3, 6 => 4 }.fetch(color)
      when "IDAT" then idat << body
      when "IEND" then break
      end
      pos += 12 + len
    end
    raw = Zlib::Inflate.inflate(idat).bytes
    stride = width * channels
    prev = Array.new(stride, 0)
    rows = Array.new(height) do |y|
      base = y * (stride + 1)
      filter = raw[base]
      line = raw[base + 1, stride]
      stride.times do |i|
        a = i >= channels ? line[i - channels] : 0
        b = prev[i]
        c = i >= channels ? prev[i - channels] : 0
        line[i] = (line[i] + case filter
                             when 0 then 0
                             when 1 then a
                             when 2 then b
                             when 3 then (a + b) / 2
                             when 4
                               p = a + b - c
                               pa = (p - a).abs
                               pb = (p - b).abs
                               pc = (p - c).abs
                               pa <= pb && pa <= pc ? a : (pb <= pc ? b : c)
                             end) & 0xff
      end
      prev = line
      line.each_slice(channels).map { |px| px[0, 3] }
    end
    [width, height, rows]
  end
end
