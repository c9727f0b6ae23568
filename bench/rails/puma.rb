# frozen_string_literal: true

# Puma (cluster) config for the bench Rails app; COW_MEMKIT as in unicorn.rb,
# plus two flags for reforking (fork_worker: worker 0 forks the others):
#   MODE+count   fork_worker 1000, Puma's default: one refork when worker 0 has served 1000
#   MODE+refork  fork_worker 0 and memkit's policy (Memkit::Refork::PumaWatcher, the
#                watcher `plugin :memkit` starts) sends Puma's refork signal
#   MODE+...+nopreload  no preload_app!: worker 0 loads the app (Puma's fork_worker docs)
# Worker 0 runs the mode's preparation again before each refork.
require_relative "modes"

mode = BenchRails::Modes.parse(ENV.fetch("COW_MEMKIT", "plain"))
workers Integer(ENV.fetch("COW_WORKERS", "4"))
threads 1, 1
bind "tcp://127.0.0.1:#{ENV.fetch('COW_PORT', '9292')}"
preload_app!(mode[:preload]) # Puma 7+ preloads by default in cluster mode
rackup File.expand_path("config.ru", __dir__)
worker_timeout 300
BenchRails::Modes.at_config(mode)
# bench/oobgc_rails.rb's probe (oobgc.ru) writes its figures before the worker stops.
public_send(respond_to?(:before_worker_shutdown) ? :before_worker_shutdown : :on_worker_shutdown) do
  BenchRails::GcProbe.flush if defined?(BenchRails::GcProbe)
end

before_fork do
  # Without preload the master holds no app: as `plugin :memkit` does there,
  # Memkit.warmup prepares its small heap and starts the malloc release.
  mode[:preload] ? BenchRails::Modes.before_fork(mode) : Memkit.warmup
end

case mode[:refork]
when :count then fork_worker 1000
when :memkit
  fork_worker 0
  # The watcher `plugin :memkit` starts, without the plugin's own hooks (the
  # mode's before_fork / before_refork above and below prepare the heap).
  watcher = nil
  before_fork do
    next if watcher

    require "memkit/refork/puma"
    log = Object.new
    def log.log(line) = $stderr.puts(line)
    watcher = Memkit::Refork::PumaWatcher.new(log: log).start
  end
end
if mode[:refork]
  refork_hook = respond_to?(:before_refork) ? :before_refork : :on_refork
  public_send(refork_hook) { BenchRails::Modes.before_refork(mode) }
end
