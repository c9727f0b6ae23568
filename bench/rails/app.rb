# frozen_string_literal: true

# A small but real Rails app for measuring copy-on-write after fork
# (bench/cow_rails.rb): ActiveRecord on SQLite with seeded rows, ERB views
# with helpers, partials and a layout, a JSON API, two locales, production
# mode with eager loading. config.ru loads it in the server's master.
#
# BENCH_RAILS_DB: the SQLite file (created and seeded by BenchRails.seed).
ENV["RAILS_ENV"] ||= "production"
ENV["DATABASE_URL"] ||= "sqlite3:#{ENV.fetch('BENCH_RAILS_DB', File.expand_path('db/bench.sqlite3', __dir__))}"

require "logger" # Rails 7.1's ActiveSupport needs it loaded first on newer concurrent-ruby
require "rails"
require "active_record/railtie"
require "action_controller/railtie"
require "action_view/railtie"
require "memkit/railtie"

module BenchRails
  class Application < Rails::Application
    config.load_defaults Rails::VERSION::STRING.to_f
    config.root = __dir__
    config.eager_load = true
    config.cache_classes = true if config.respond_to?(:cache_classes=)
    config.consider_all_requests_local = false
    config.secret_key_base = "memkit-bench-rails-#{'0' * 64}"
    config.logger = ActiveSupport::Logger.new(File::NULL)
    config.log_level = :warn
    config.public_file_server.enabled = false
    config.i18n.available_locales = %i[en fr]
    config.i18n.default_locale = :en
    config.hosts.clear
    # One of each kind of page the bench sends, with ids the bench never asks
    # for (the workers' own requests stay cold); no side effects.
    config.memkit.warmup_requests = ["/products", "/products?page=90&locale=fr", "/products/1999",
                                     "/products/1998?locale=fr", "/categories/books", "/categories/music?locale=fr",
                                     "/api/products?page=95", "/api/products.json?page=96&locale=fr"]
    config.active_record.sqlite3_production_warning = false if config.active_record.respond_to?(:sqlite3_production_warning=)
  end

  CATEGORIES = %w[books music garden tools toys kitchen sports travel office health].freeze

  # Creates the schema and rows once; the servers open the file read-mostly.
  def self.seed(products: 2_000)
    require_relative "db/schema"
    Schema.create
    rng = Random.new(42)
    words = Array.new(2_000) { Array.new(4 + rng.rand(6)) { (97 + rng.rand(26)).chr }.join }
    now = Time.utc(2026, 11, 24)
    ActiveRecord::Base.transaction do
      categories = CATEGORIES.map.with_index do |name, i|
        Category.create!(name: name, slug: name, position: i)
      end
      products.times do |i|
        p = Product.create!(category: categories[i % categories.size], name: "#{words.sample(random: rng)} #{i}",
                            sku: format("SKU-%06d", i), price_cents: rng.rand(100_000),
                            description: Array.new(30) { words.sample(random: rng) }.join(" "),
                            stock: rng.rand(50), created_at: now - rng.rand(10_000_000))
        3.times do
          Review.create!(product: p, author: words.sample(random: rng).capitalize, rating: 1 + rng.rand(5),
                         body: Array.new(20) { words.sample(random: rng) }.join(" "), created_at: now - rng.rand(1_000_000))
        end
      end
    end
  end
end
