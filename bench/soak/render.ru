# frozen_string_literal: true

# A small page: 20 rows rendered to HTML, some tens of microseconds, nearer a
# real endpoint than hello.ru.
run lambda { |env|
  rows = Array.new(20) { |i| "<tr><td>#{i}</td><td>#{env['PATH_INFO']}</td><td>#{(i * 3.7).round(2)}</td></tr>" }
  [200, { "content-type" => "text/html" }, ["<table>", rows.join, "</table>"]]
}
