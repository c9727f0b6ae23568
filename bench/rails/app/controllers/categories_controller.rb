# frozen_string_literal: true

class CategoriesController < ApplicationController
  def show
    @category = Category.find_by!(slug: params[:id])
    @products = @category.products.includes(:reviews).recent.limit(15)
  end
end
