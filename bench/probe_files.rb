# frozen_string_literal: true

require "json"

# What the benchmarks' GC probes (bench/oobgc_app.rb, bench/rails/oobgc.ru)
# share: a probe writes its figures when its worker exits, and from Puma's
# worker-shutdown hook too, as a Puma worker whose master has gone calls
# exit!, cutting its at_exit short; and on SIGPWR, which bench/oobgc_matrix.rb
# and bench/oobgc_rails.rb send before they stop the server, as a Puma 8
# worker on Ruby 3.3/3.4 can hang at shutdown before that hook. Each write
# replaces the file whole, so a reader never sees half of one.
#
#   class Probe
#     extend ProbeFiles   # Probe.flush writes every probe of this process
#     def initialize(...) = Probe.track(self)  # and #write at exit
#   end
module ProbeFiles
  # Also has SIGPWR write the figures, on a thread: they include
  # OobGC.stats, which takes a lock, and a trap handler may not.
  def track(probe)
    Signal.trap("PWR") { Thread.new { flush } } unless @probes
    (@probes ||= []) << probe
    at_exit { probe.write }
  end

  def flush = (@probes || []).each(&:write)

  def self.write(path, figures)
    File.write("#{path}.tmp", JSON.generate(figures))
    File.rename("#{path}.tmp", path)
  end
end
