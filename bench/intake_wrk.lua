-- The intake benchmark's wrk script (bench/intake_wrk.py writes its requests and reads its last line).
-- wrk's Lua has no HMAC: every request was built and signed beforehand, whole (head and body), into the file named
-- by BENCH_REQUESTS as records "<length>\n<raw HTTP request>". Each thread reads the file at init and walks it;
-- after BENCH_LIMIT answers it stops, and done() prints one line "BENCH_JSON {...}": the answers by status, the
-- requests sent and wrk's latency percentiles (microseconds) over the answered requests.
local path = os.getenv("BENCH_REQUESTS")
local limit = tonumber(os.getenv("BENCH_LIMIT"))
local requests = {}
local threads = {}
-- wrk's main thread sleeps out -d whatever the threads do; SIGINT ends that sleep (its own handler), so a thread
-- that has its answers stops itself and interrupts the sleep (LuaJIT's ffi: getpid and kill from libc).
local ffi = require("ffi")
ffi.cdef("int getpid(void); int kill(int pid, int sig);")

sent, answered, s202, s200, sother, wrapped = 0, 0, 0, 0, 0, 0

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  local file = assert(io.open(path, "rb"))
  local data = file:read("*a")
  file:close()
  local at = 1
  while at <= #data do
    local newline = data:find("\n", at, true)
    local length = tonumber(data:sub(at, newline - 1))
    requests[#requests + 1] = data:sub(newline + 1, newline + length)
    at = newline + length + 1
  end
end

function request()
  sent = sent + 1
  local i = sent
  if i > #requests then  -- past the file: start again (the bare endpoint only; foreman's file has a margin)
    wrapped = wrapped + 1
    i = (i - 1) % #requests + 1
  end
  return requests[i]
end

function response(status, headers, body)
  answered = answered + 1
  if status == 202 then s202 = s202 + 1 elseif status == 200 then s200 = s200 + 1 else sother = sother + 1 end
  if answered == limit then
    wrk.thread:stop()
    ffi.C.kill(ffi.C.getpid(), 2)
  end
end

function done(summary, latency, requests_)
  local totals = {sent = 0, answered = 0, s202 = 0, s200 = 0, sother = 0, wrapped = 0}
  for _, thread in ipairs(threads) do
    for name, _ in pairs(totals) do totals[name] = totals[name] + thread:get(name) end
  end
  local e = summary.errors
  io.write(string.format(
    'BENCH_JSON {"duration_us": %d, "wrk_requests": %d, "sent": %d, "answered": %d, "s202": %d, "s200": %d, ' ..
    '"sother": %d, "wrapped": %d, "errors": {"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}, ' ..
    '"p50_us": %d, "p90_us": %d, "p99_us": %d, "max_us": %d, "mean_us": %.1f}\n',
    summary.duration, summary.requests, totals.sent, totals.answered, totals.s202, totals.s200, totals.sother,
    totals.wrapped, e.connect, e.read, e.write, e.status, e.timeout, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.max, latency.mean))
end
