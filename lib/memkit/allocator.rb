# frozen_string_literal: true

require_relative "../memkit"

module Memkit
  # Which malloc a process really runs, and the arena settings it was started
  # with: what a fleet needs to know before trusting "we use jemalloc".
  #
  #   Memkit::Allocator.read(1234)  # => #<Allocator name="jemalloc", arena_max=nil, ...>
  #
  # The name comes from /proc/PID/maps: a preloaded or linked jemalloc,
  # tcmalloc or mimalloc maps its shared library into the process; with none
  # of them mapped, malloc is glibc's. The settings come from
  # /proc/PID/environ, which shows the environment as it was at exec (a later
  # setenv is invisible, and so is a setting glibc reads only at startup that
  # the process changed afterwards); another user's environ is unreadable,
  # and then the settings are nil with environ_readable false.
  Allocator = Struct.new(:pid, :name, :arena_max, :malloc_conf, :environ_readable, keyword_init: true) do
    # glibc's arena_max only matters where glibc's malloc is the one in use.
    def glibc? = name == "glibc"
  end

  class Allocator
    # Checked in this order; the first library found in the maps names it.
    LIBRARIES = { "jemalloc" => /libjemalloc/, "tcmalloc" => /libtcmalloc/, "mimalloc" => /libmimalloc/ }.freeze

    class << self
      # Raises NoSuchProcess or PermissionDenied (from ProcFS) when the maps
      # cannot be read; an unreadable environ only leaves the settings nil.
      def read(pid)
        pid = ProcFS.pid!(pid)
        name = name_from_maps(ProcFS.read(pid, "maps"))
        env = begin
          environ(ProcFS.read(pid, "environ"))
        rescue PermissionDenied
          nil
        end
        settings = env ? settings(env) : {}
        new(pid: pid, name: name, environ_readable: !env.nil?, **settings).freeze
      end

      def name(pid) = name_from_maps(ProcFS.read(ProcFS.pid!(pid), "maps"))

      # The allocator named by the text of a maps file.
      def name_from_maps(maps)
        maps = ProcFS.binary(maps)
        LIBRARIES.each { |lib, pattern| return lib if maps.match?(pattern) }
        "glibc"
      end

      # NUL-separated KEY=VALUE pairs, as /proc/PID/environ holds them.
      def environ(raw)
        ProcFS.binary(raw).split("\0").each_with_object({}) do |pair, env|
          key, value = pair.split("=", 2)
          env[key] = value.force_encoding(Encoding::UTF_8).scrub if value
        end
      end

      # arena_max: glibc.malloc.arena_max from GLIBC_TUNABLES when set there,
      # else MALLOC_ARENA_MAX; nil when neither is set (glibc's default, up to
      # 8 arenas per core). malloc_conf: jemalloc's MALLOC_CONF (narenas and
      # friends), nil when unset.
      def settings(env)
        tunable = env["GLIBC_TUNABLES"].to_s.split(":").filter_map do |item|
          key, value = item.split("=", 2)
          value if key == "glibc.malloc.arena_max"
        end.last
        { arena_max: tunable || env["MALLOC_ARENA_MAX"], malloc_conf: env["MALLOC_CONF"] || env["JE_MALLOC_CONF"] }
      end
    end
  end
end
