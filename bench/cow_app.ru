# frozen_string_literal: true

# rackup file for bench/cow_app.rb, booted by bench/cow_unicorn.rb and
# bench/cow_puma.rb with preload (the app is loaded once, in the master).
require_relative "cow_app"
CowApp.boot
run CowApp
