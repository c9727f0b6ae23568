# frozen_string_literal: true

# The app shape for the copy-on-write benches and tests lives in the gem
# (lib/memkit/bench/cow_app.rb, so that `memkit bench cow` runs installed);
# here it is CowApp for bench/cow_*.rb and bench/cow_app.ru.
require_relative "../lib/memkit/bench/cow_app"
CowApp = Memkit::Bench::CowApp unless defined?(CowApp)
