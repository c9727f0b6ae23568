# frozen_string_literal: true

module Memkit
  class MemoryLimit
    # Decides, from one reading of the whole server tree, whether the worker
    # asking should be replaced: the tree's PSS (master, workers and any other
    # children, each shared page counted once across them) is over the limit,
    # and this worker is the largest worker by USS -- the memory its exit
    # gives back. Only that one acts; the others keep serving. Once it has
    # gone and its replacement has started small, the next reading decides
    # again, so an over-full tree sheds its largest workers one at a time.
    #
    # Pure: the readings come in as arguments (see MemoryLimit#tree_check).
    class TreePolicy
      attr_reader :limit

      # limit: bytes of tree PSS.
      def initialize(limit:)
        raise InvalidArgument, "Memkit::MemoryLimit max_tree_pss must be a positive Integer (got #{limit.inspect})" \
          unless limit.is_a?(Integer) && limit.positive?

        @limit = limit
      end

      # tree_pss: the tree's total PSS in bytes.
      # workers: { pid => uss } for the workers that may be replaced (the
      #   master, a mold and other helpers left out).
      # me: the asking worker's pid.
      # Returns the reason string if `me` should go, else nil.
      def decide(tree_pss:, workers:, me:)
        return nil if tree_pss <= @limit || !workers.key?(me)

        # Ties go to the older process (lower pid): the same answer in every worker.
        largest, uss = workers.max_by { |pid, bytes| [bytes, -pid] }
        return nil unless largest == me

        others = workers.reject { |pid, _| pid == me }.values.sort.reverse.map { |b| Units.human(b) }
        format("tree pss %s > limit %s; this worker is the largest of %d (uss %s; others %s)",
               Units.human(tree_pss), Units.human(@limit), workers.size, Units.human(uss),
               others.empty? ? "none" : others.join(", "))
      end
    end
  end
end
