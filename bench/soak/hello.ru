# frozen_string_literal: true

# The cheapest app there is: any driver overhead shows in full against it.
run ->(_env) { [200, { "content-type" => "text/plain" }, ["ok"]] }
