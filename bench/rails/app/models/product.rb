# frozen_string_literal: true

class Product < ApplicationRecord
  belongs_to :category
  has_many :reviews, dependent: :destroy
  validates :name, :sku, presence: true
  scope :in_stock, -> { where("stock > 0") }
  scope :recent, -> { order(created_at: :desc) }

  def price = price_cents / 100.0

  def average_rating
    ratings = reviews.map(&:rating)
    ratings.empty? ? nil : ratings.sum.fdiv(ratings.size).round(1)
  end

  def as_json(*)
    { id: id, name: name, sku: sku, price: price, stock: stock, category: category.slug,
      rating: average_rating, created_at: created_at.iso8601 }
  end
end
