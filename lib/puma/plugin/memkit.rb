# frozen_string_literal: true

require "puma/plugin"
require "memkit"
require "memkit/out_of_band"

# `plugin :memkit` in config/puma.rb (cluster mode, with preload_app!): the
# master runs Memkit.warmup once the app is loaded and before it forks the
# workers. With fork_worker, worker 0 runs it again before each refork,
# through whichever hook this Puma names (before_refork on Puma 7+, on_refork
# on Puma 5 and 6; Puma 5 reforks only without preload_app!), and the master
# watches the workers' memory and asks for a refork when they have drifted
# from worker 0 (Memkit::Refork::PumaWatcher; docs/REFORK.md). Together
# with `require "memkit/fork"` the fork itself finds the heap prepared and
# does nothing twice. It also gives Memkit::OobGC and Memkit::MemoryLimit
# Puma's out_of_band hook, where the worker accepts nothing while they run a
# GC or ask for the worker's replacement.
#
# For warmup options, skip the plugin and write the hook yourself:
#   before_fork { Memkit.warmup(compact: false) }
Puma::Plugin.create do
  def start(launcher)
    # Puma 6+ logs through launcher.log_writer; Puma 5 through launcher.events.
    # Both answer #log(String).
    @log_writer = launcher.respond_to?(:log_writer) ? launcher.log_writer : launcher.events
    return unless launcher.options[:fork_worker] && launcher.options[:workers].to_i.positive?

    require "memkit/refork/puma"
    watcher = Memkit::Refork::PumaWatcher.new(log: @log_writer)
    # in_background threads start in the master once it runs; forked workers have none of them.
    in_background { watcher.run }
  end

  # Puma calls config(dsl) for plugins loaded by `plugin :name`.
  def config(dsl)
    dsl.before_fork { warmup("before_fork") }
    # Puma 7+ names the refork hook before_refork (on_refork stays as a
    # deprecated alias); Puma 5 and 6 have only on_refork.
    refork_hook = dsl.respond_to?(:before_refork) ? :before_refork : :on_refork
    dsl.public_send(refork_hook) { warmup(refork_hook.to_s) } if dsl.respond_to?(refork_hook)
    # What registered itself when the app built its middleware: MemoryLimit's
    # replacement first, then OobGC's collection.
    dsl.out_of_band { Memkit::OutOfBand.run }
    Memkit::OutOfBand.installed!
    # Memkit::Metrics labels each worker's series with Puma's index, which a
    # replacement worker inherits (Puma 7+ names the hook before_worker_boot).
    boot_hook = dsl.respond_to?(:before_worker_boot) ? :before_worker_boot : :on_worker_boot
    dsl.public_send(boot_hook) { |index| Memkit::Metrics.worker_booted(index) unless Memkit.autoload?(:Metrics) }
  end

  def warmup(hook)
    report = Memkit.warmup
    return if @log_writer.nil?

    # A skipped run is logged too: it says the mold was already prepared.
    where = "(#{hook}) in pid #{Process.pid}"
    return @log_writer.log("* memkit: heap already prepared for fork #{where}: #{report.reason}") if report.skipped

    @log_writer.log format("* memkit: heap prepared for fork %s, %.0f ms: %s; young objects %d -> %d", where,
                           report.duration * 1000, report.steps.join(", "), report.young_before, report.young_after)
  end
end
