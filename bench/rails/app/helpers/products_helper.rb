# frozen_string_literal: true

module ProductsHelper
  def price_tag(product)
    content_tag(:span, number_to_currency(product.price, locale: I18n.locale), class: "price")
  end

  def stars(rating)
    return t("products.unrated") unless rating

    safe_join([content_tag(:span, "★" * rating.round, class: "stars"), " ", t("products.rating", rating: rating)])
  end

  def stock_badge(product)
    key = product.stock.zero? ? "out" : (product.stock < 5 ? "low" : "in")
    content_tag(:em, t("products.stock.#{key}", count: product.stock), class: "stock-#{key}")
  end
end
