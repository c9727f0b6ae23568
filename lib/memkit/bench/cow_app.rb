# frozen_string_literal: true

require "json"
require "erb"
require "digest"

# A Rack app with the memory shape of a typical booted web app, for measuring
# copy-on-write after fork (memkit bench cow, bench/cow_servers.rb and
# test/integration/servers_fork_test.rb, which know it as CowApp through
# bench/cow_app.rb). It ships in the gem so that `memkit bench cow` runs
# from an installed gem. Deterministic: same scale, same heap.
#
# At boot it parses JSON into hashes and strings, builds indexes, compiles ERB
# templates into methods, generates a few thousand methods, and leaves the
# heap fragmented by interleaving retained objects with boot garbage. Each
# request reads shared records and strings (string methods that compute the
# coderange), renders a template, builds a JSON body and allocates garbage.
#
#   GET /          a page; the body starts with "pid=PID count=N"; once a
#                  worker has served COW_APP_REQUESTS it answers without work
#   GET /gc        a full GC in the worker that takes it, then holds it busy
#                  for ?hold=SECONDS, so concurrent /gc reach distinct workers;
#                  ?trim=1 also runs malloc_trim(0) after it
#   GET /stat      the worker's GC.stat and malloc arena counters as JSON
#                  (?hold=SECONDS as for /gc)
module Memkit
  module Bench
    module CowApp
      CATEGORIES = %w[books music garden tools toys kitchen sports travel office health].freeze

      module Templates; end

      class << self
        attr_reader :records, :by_id, :by_category, :by_tag

        # scale 1 is about 100 MB of heap.
        def boot(scale: Float(ENV.fetch("COW_APP_SCALE", "1")))
          n = (60_000 * scale).to_i
          rng = Random.new(42)
          vocabulary = Array.new(5_000) { Array.new(3 + rng.rand(6)) { (97 + rng.rand(26)).chr }.join }
          word = -> { vocabulary[rng.rand(vocabulary.size)] }
          garbage = []
          json = JSON.generate(Array.new(n) do |i|
            garbage << "tmp-#{i}" * 3 if i.odd? # boot garbage between the retained objects
            { "id" => i, "name" => "item #{i} #{word.call}", "category" => CATEGORIES[i % CATEGORIES.size],
              "price" => rng.rand(10_000) / 100.0, "tags" => Array.new(3) { word.call },
              "description" => Array.new(8) { word.call }.join(" "), "sku" => Digest::MD5.hexdigest(i.to_s)[0, 12],
              "attrs" => { "w" => rng.rand(100), "h" => rng.rand(100), "color" => word.call } }
          end)
          @records = JSON.parse(json)
          json = nil
          @by_id = @records.to_h { |r| [r["id"], r] }
          @by_category = @records.group_by { |r| r["category"] }
          @by_tag = Hash.new { |h, k| h[k] = [] }
          @records.each { |r| r["tags"].each { |t| @by_tag[t] << r["id"] } }
          @by_tag.default_proc = nil
          compile_templates((300 * [scale, 1].min).to_i)
          generate_methods((3_000 * [scale, 1].min).to_i)
          garbage.clear
          @count = 0
          @limit = ENV["COW_APP_REQUESTS"]&.then { |n| Integer(n) }
          self
        end

        def compile_templates(count)
          count.times do |i|
            src = +"<div class=\"t#{i}\"><h1><%= r['name'] %></h1><p><%= r['description'] %></p><ul>"
            src << "<% r['tags'].each do |t| %><li><%= t.upcase %></li><% end %></ul>"
            src << "<span><%= format('%.2f', r['price']) %> #{i}</span></div>"
            ERB.new(src).def_method(Templates, "render_#{i}(r)")
          end
        end

        def generate_methods(count)
          count.times do |i|
            Templates.module_eval("def self.helper_#{i}(x) = x.to_s + #{i.to_s.inspect}", __FILE__, __LINE__)
          end
        end

        def call(env)
          path = env["PATH_INFO"]
          return gc(env) if path == "/gc"
          return stat(env) if path == "/stat"
          return memkit if path == "/memkit"

          return full if @limit && @count >= @limit

          # Warm-up requests in the master (Memkit.warmup(app:)) do the same
          # work but are not counted: each worker still serves its own N.
          seq = env["memkit.warmup"] ? -(@warm = @warm.to_i + 1) : (@count += 1)
          rng = Random.new(seq.abs)
          record = @by_id[rng.rand(@records.size)]
          related = @by_category[record["category"]].sample(5, random: rng)
          tagged = record["tags"].flat_map { |t| @by_tag[t].first(3) }
          html = Templates.instance_method(:"render_#{seq.abs % Templates.instance_methods.size}")
                          .bind_call(Object.new, record)
          matches = related.count { |r| r["name"].include?("item") && r["description"].match?(/[aeiou]{2}/) }
          body = +"pid=#{Process.pid} count=#{@count}\n"
          body << html << "\n" << JSON.generate(related.map { |r| r.slice("id", "name", "price") })
          helper = :"helper_#{seq.abs % 3000 % Templates.singleton_methods.size}"
          body << "\n" << Templates.public_send(helper, matches)
          body << " " << tagged.size.to_s << " " << record["sku"].upcase
          [200, { "content-type" => "text/plain" }, [body]]
        end

        # A worker that has served COW_APP_REQUESTS answers without working,
        # and slowly, so that the other workers accept the next connections.
        def full
          sleep 0.02
          [200, { "content-type" => "text/plain" }, ["pid=#{Process.pid} count=#{@count} full\n"]]
        end

        # How this worker's master was prepared, as JSON.
        def memkit
          warmup = defined?(Memkit::Warmup) && Memkit::Warmup.respond_to?(:runs) ? Memkit::Warmup : nil
          info = { pid: Process.pid, ppid: Process.ppid, count: @count, warmup_runs: warmup&.runs,
                   last_report: warmup&.last_report&.to_h, fork_hook: defined?(Memkit::Fork) ? true : false }
          [200, { "content-type" => "application/json" }, [JSON.generate(info)]]
        end

        # This worker's GC counters and malloc arena (mallinfo2, where glibc
        # has it), as JSON; holds the worker like /gc so concurrent calls
        # reach distinct workers.
        def stat(env)
          info = { pid: Process.pid, gc: GC.stat }
          if defined?(Memkit::Libc) && Memkit::Libc.mallinfo2? && (m = Memkit::Libc.mallinfo2)
            info[:malloc] = m.to_h
          end
          hold = env["QUERY_STRING"].to_s[/hold=([\d.]+)/, 1].to_f
          sleep(hold) if hold.positive?
          [200, { "content-type" => "application/json" }, [JSON.generate(info)]]
        end

        def gc(env)
          GC.start(full_mark: true, immediate_sweep: true)
          # ?trim=1: then return malloc's free pages (a diagnostic: how much
          # of the worker is free memory glibc kept)
          Memkit::Libc.malloc_trim if env["QUERY_STRING"].to_s.include?("trim=1") && defined?(Memkit::Libc)
          hold = env["QUERY_STRING"].to_s[/hold=([\d.]+)/, 1].to_f
          sleep(hold) if hold.positive?
          [200, { "content-type" => "text/plain" }, ["pid=#{Process.pid} count=#{@count} gc=#{GC.count}\n"]]
        end
      end
    end
  end
end
