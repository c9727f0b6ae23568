-- wrk script for bench/oobgc.rb.
-- OOBGC_PACE_MS > 0: each connection waits that long between a response and
-- its next request, so workers have idle moments as in production.
-- OOBGC_HIST: file to write the whole latency histogram to ("usec count" per
-- line), so the bench can pool rounds and take percentiles of the pool rather
-- than medians of a few per-round tail samples.
local pace = tonumber(os.getenv("OOBGC_PACE_MS") or "0")
if pace > 0 then
  function delay()
    return pace
  end
end

function done(summary, latency, requests)
  local path = os.getenv("OOBGC_HIST")
  if not path then return end
  local f = assert(io.open(path, "w"))
  for i = 1, #latency do
    local usec, count = latency(i)
    f:write(string.format("%d %d\n", usec, count))
  end
  f:close()
end
