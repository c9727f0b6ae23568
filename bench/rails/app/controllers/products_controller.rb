# frozen_string_literal: true

class ProductsController < ApplicationController
  PER_PAGE = 20

  def index
    page = [params[:page].to_i, 1].max
    @products = Product.includes(:category, :reviews).recent.offset((page - 1) * PER_PAGE).limit(PER_PAGE)
    @page = page
    respond_to do |format|
      format.html
      format.json { render json: { page: page, products: @products.as_json } }
    end
  end

  def show
    @product = Product.includes(:category, :reviews).find(params[:id])
    @related = @product.category.products.in_stock.where.not(id: @product.id).limit(5)
  end
end
