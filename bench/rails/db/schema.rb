# frozen_string_literal: true

module BenchRails
  module Schema
    def self.create
      ActiveRecord::Schema.define do
        create_table :categories, force: true do |t|
          t.string :name, null: false
          t.string :slug, null: false, index: { unique: true }
          t.integer :position, null: false
        end
        create_table :products, force: true do |t|
          t.references :category, null: false
          t.string :name, null: false
          t.string :sku, null: false, index: { unique: true }
          t.integer :price_cents, null: false
          t.text :description
          t.integer :stock, null: false, default: 0
          t.timestamps
        end
        create_table :reviews, force: true do |t|
          t.references :product, null: false
          t.string :author, null: false
          t.integer :rating, null: false
          t.text :body
          t.timestamps
        end
      end
    end
  end
end
