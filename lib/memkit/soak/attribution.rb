# frozen_string_literal: true

module Memkit
  module Soak
    # Which allocation sites keep objects alive: trace allocations for a
    # window of requests, note the traced objects that survive a full GC,
    # serve as many requests again untraced (so cache entries that get
    # evicted have time to go), run a full GC, and group the noted objects
    # still alive by file:line and class.
    #
    # Survivors are held in an ObjectSpace::WeakMap, not looked up by
    # allocation info after tracing stops: once tracing is off, Ruby no
    # longer drops the info of freed objects, and a new object in a reused
    # slot would be reported with the dead one's file and line.
    #
    # Runs after the measured requests, never during them: tracing costs a
    # table entry per object, which would show up as growth in the curve.
    # Only Ruby objects are seen; a String or Array that grows in place (one
    # buffer appended to forever) or memory malloc'd by a C extension is not
    # an allocation site and shows in rss and malloc_bytes only.
    module Attribution
      Site = Struct.new(:site, :class_name, :count, :bytes, :per_request, keyword_init: true)

      module_function

      def run(driver, window:, top: 10)
        require "objspace"
        class_of = Kernel.instance_method(:class)
        own = File.expand_path("../..", __dir__)
        noted = ObjectSpace::WeakMap.new
        keys = {}
        GC.start
        ObjectSpace.trace_object_allocations_start
        begin
          driver.drive(window)
          GC.start
          ObjectSpace.each_object do |obj|
            file = ObjectSpace.allocation_sourcefile(obj) or next
            next if file.start_with?(own)

            site = [file, ObjectSpace.allocation_sourceline(obj), class_of.bind_call(obj).name || "(anonymous)"]
            noted[obj] = (keys[site] ||= site.freeze)
          end
        ensure
          ObjectSpace.trace_object_allocations_stop
          ObjectSpace.trace_object_allocations_clear
        end
        driver.drive(window)
        GC.start
        sites = Hash.new { |h, k| h[k] = [0, 0] }
        noted.each do |obj, site|
          entry = sites[site]
          entry[0] += 1
          entry[1] += ObjectSpace.memsize_of(obj)
        end
        sites.sort_by { |_, (_, bytes)| -bytes }.first(top).map do |(file, line, klass), (count, bytes)|
          Site.new(site: "#{file}:#{line}", class_name: klass, count: count, bytes: bytes,
                   per_request: bytes.fdiv(window).round(1))
        end
      end
    end
  end
end
