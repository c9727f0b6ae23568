# frozen_string_literal: true

class ApplicationController < ActionController::Base
  around_action :switch_locale

  private

  def switch_locale(&action)
    locale = params[:locale].presence_in(%w[en fr]) || I18n.default_locale
    I18n.with_locale(locale, &action)
  end

  def default_url_options = params[:locale] ? { locale: params[:locale] } : {}
end
