# frozen_string_literal: true

# Does a malloc past malloc_increase_bytes_limit start a GC at once, and does Ruby raise the limit then?
GC.start
s0 = GC.stat
c = GC.count
bytes = s0[:malloc_increase_bytes_limit] - s0[:malloc_increase_bytes] + 1
x = String.new(capacity: bytes); x = nil
s1 = GC.stat
puts "#{RUBY_VERSION} limit #{s0[:malloc_increase_bytes_limit]} increase #{s0[:malloc_increase_bytes]} malloc #{bytes} -> GCs #{GC.count - c} (#{GC.latest_gc_info.slice(:gc_by, :major_by, :need_major_by)}) limit now #{s1[:malloc_increase_bytes_limit]}"
