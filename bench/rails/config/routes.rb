# frozen_string_literal: true

Rails.application.routes.draw do
  resources :products, only: %i[index show]
  resources :categories, only: :show
  get "api/products", to: "products#index", defaults: { format: :json }
  root "products#index"
end
