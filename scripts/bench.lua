-- wrk script of scripts/bench.sh: one JSON body per request, and one `key=value` summary line at the end.
--   wrk ... -s bench.lua URL -- once  PREFIX        each line of PREFIX.<thread> once (pre-signed envelopes)
--   wrk ... -s bench.lua URL -- cycle PREFIX        the same, starting over at the end (a proxy that checks nothing)
--   wrk ... -s bench.lua URL -- claim RUN [TOKEN]   POST /claim bodies with a request_id unique to each request
--   wrk ... -s bench.lua URL -- mcp TOKEN SESSION   MCP tools/call bodies (unique ids and arguments) with a
--                                                   bearer token and an Mcp-Session-Id (SPEC 17)

local threads = {}

function setup(thread)
  thread:set("index", #threads)
  table.insert(threads, thread)
end

function init(args)
  mode = args[1]
  exhausted = 0
  sent = 0
  headers = { ["Content-Type"] = "application/json" }
  if mode == "claim" then
    run = args[2]
    if args[3] then
      headers["Authorization"] = "Bearer " .. args[3]
    end
  elseif mode == "mcp" then
    headers["Authorization"] = "Bearer " .. args[2]
    headers["Mcp-Session-Id"] = args[3]
    headers["Accept"] = "application/json, text/event-stream"
  else
    file = assert(io.open(args[2] .. "." .. index, "r"))
  end
end

local function next_line()
  local line = file:read("*l")
  if line == nil and mode == "cycle" then
    file:seek("set", 0)
    line = file:read("*l")
  end
  return line
end

function request()
  local body
  if mode == "claim" then
    sent = sent + 1
    body = string.format('{"request_id":"%s-%d-%d","action":"bench.claim"}', run, index, sent)
  elseif mode == "mcp" then
    sent = sent + 1
    local n = index * 1000000000 + sent
    body = string.format('{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"bench.echo","arguments":{"n":%d}}}', n, n)
  else
    body = next_line()
    if body == nil then
      -- Out of envelopes: stop this thread; the resend below is a replay and is reported as such.
      exhausted = 1
      wrk.thread:stop()
      body = last
    end
    last = body
  end
  return wrk.format("POST", nil, headers, body)
end

function done(summary, latency, requests)
  local ran_out = 0
  for _, thread in ipairs(threads) do
    ran_out = ran_out + thread:get("exhausted")
  end
  local e = summary.errors
  io.write(string.format(
    "requests=%d duration_us=%d p50_us=%d p99_us=%d status_errors=%d socket_errors=%d exhausted_threads=%d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99), e.status,
    e.connect + e.read + e.write + e.timeout, ran_out))
end
