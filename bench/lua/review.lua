-- wrk script for amp's benchmark: POST one AdmissionReview (or Pod) body,
-- read from the file named by the first script argument, on every request
-- of every keep-alive connection, and print the run's summary as one JSON
-- line prefixed "AMPBENCH " for bench/run to parse.
--
--   wrk -t1 -c16 -d10s -s bench/lua/review.lua URL -- BODY_FILE

local body_file = nil

function init(args)
   body_file = args[1]
   if body_file == nil then
      error("usage: wrk ... -s review.lua URL -- BODY_FILE")
   end
   local f = assert(io.open(body_file, "rb"))
   local body = f:read("*a")
   f:close()
   wrk.method = "POST"
   wrk.body = body
   wrk.headers["Content-Type"] = "application/json"
end

function done(summary, latency, requests)
   local e = summary.errors
   io.write(string.format(
      'AMPBENCH {"requests":%d,"duration_us":%d,"bytes":%d,' ..
      '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
      '"latency_us":{"min":%d,"mean":%.1f,"stdev":%.1f,"max":%d,' ..
      '"p50":%d,"p75":%d,"p90":%d,"p99":%d,"p999":%d}}\n',
      summary.requests, summary.duration, summary.bytes,
      e.connect, e.read, e.write, e.status, e.timeout,
      latency.min, latency.mean, latency.stdev, latency.max,
      latency:percentile(50), latency:percentile(75), latency:percentile(90),
      latency:percentile(99), latency:percentile(99.9)))
end
