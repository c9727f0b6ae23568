-- wrk script: each connection waits OOBGC_PACE_MS between a response and its
-- next request, so workers have idle moments as in production (not saturated).
local pace = tonumber(os.getenv("OOBGC_PACE_MS") or "10")
function delay()
  return pace
end
