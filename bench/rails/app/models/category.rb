# frozen_string_literal: true

class Category < ApplicationRecord
  has_many :products, dependent: :destroy
  scope :ordered, -> { order(:position) }

  def to_param = slug
end
