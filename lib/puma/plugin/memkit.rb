# frozen_string_literal: true

require "puma/plugin"
require "memkit"
require "memkit/out_of_band"

# `plugin :memkit` in config/puma.rb (cluster mode, with preload_app!): the
# master runs Memkit.warmup once the app is loaded and before it forks the
# workers, and again before each refork when fork_worker is on. Both go
# through Puma's public hooks (before_fork, before_refork); together with
# `require "memkit/fork"` the fork itself finds the heap prepared and does
# nothing twice. It also gives Memkit::OobGC and Memkit::MemoryLimit Puma's
# out_of_band hook, where the worker accepts nothing while they run a GC or
# ask for the worker's replacement.
#
# For warmup options, skip the plugin and write the hook yourself:
#   before_fork { Memkit.warmup(compact: false) }
Puma::Plugin.create do
  def start(launcher)
    @log_writer = launcher.log_writer if launcher.respond_to?(:log_writer)
  end

  # Puma calls config(dsl) for plugins loaded by `plugin :name`.
  def config(dsl)
    dsl.before_fork { warmup("before_fork") }
    dsl.before_refork { warmup("before_refork") } if dsl.respond_to?(:before_refork)
    # Only for the middleware the app loaded (autoload? is nil once loaded).
    dsl.out_of_band do
      next if !Memkit.autoload?(:MemoryLimit) && Memkit::MemoryLimit.out_of_band

      # What registered itself (OobGC does when the app builds its middleware).
      Memkit::OutOfBand.run
    end
  end

  def warmup(hook)
    report = Memkit.warmup
    return if report.skipped || @log_writer.nil?

    @log_writer.log format("* memkit: heap prepared for fork (%s) in %.0f ms: %s; young objects %d -> %d",
                           hook, report.duration * 1000, report.steps.join(", "), report.young_before, report.young_after)
  end
end
