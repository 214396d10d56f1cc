-- wrk script for `make server-load`: asks the server for random orders and checks every
-- response it gets. A response counts as wrong unless its status is 200 and its body is
--   id=<id> user=user-<id> price=<p> stock=<s> total=<p*s>
-- with p and s recomputed here from the id (Catalog in Examples/Sources/server).
-- `done` prints the totals and a final line "server-load: PASS" or "server-load: FAIL";
-- the make target greps for PASS (wrk's own exit status does not see any of this).

local threads = {}

function setup(thread)
  thread:set("thread_number", #threads)
  table.insert(threads, thread)
end

function init(args)
  checked, wrong, first_wrong = 0, 0, ""
  math.randomseed(20260 + thread_number)
end

function request()
  return wrk.format("GET", "/order/" .. math.random(0, 999999))
end

local function expected(id)
  local price = (id % 100) * 7 % 100 + 1
  local stock = 0
  for shard = 0, 2 do stock = stock + (id % 4 + shard) % 4 end
  return string.format("id=%d user=user-%d price=%d stock=%d total=%d\n", id, id, price, stock, price * stock)
end

function response(status, headers, body)
  checked = checked + 1
  local id = body and body:match("^id=(%d+) ")
  if status == 200 and id and body == expected(tonumber(id)) then
    return
  end
  wrong = wrong + 1
  if first_wrong == "" then
    first_wrong = "status " .. status .. ", body \"" .. tostring(body):gsub("\n", "\\n") .. "\""
  end
end

function done(summary, latency, requests)
  local total_checked, total_wrong, example = 0, 0, ""
  for _, thread in ipairs(threads) do
    total_checked = total_checked + thread:get("checked")
    total_wrong = total_wrong + thread:get("wrong")
    if example == "" then example = thread:get("first_wrong") end
  end
  local e = summary.errors
  local socket_errors = e.connect + e.read + e.write + e.timeout
  local seconds = summary.duration / 1e6
  local function ms(us) return us / 1000 end

  io.write(string.format("server-load: %d requests in %.2f s: %.0f requests/s\n",
    summary.requests, seconds, summary.requests / seconds))
  io.write(string.format("server-load: latency mean %.2f ms, p50 %.2f ms, p90 %.2f ms, p99 %.2f ms, max %.2f ms\n",
    ms(latency.mean), ms(latency:percentile(50)), ms(latency:percentile(90)),
    ms(latency:percentile(99)), ms(latency.max)))
  io.write(string.format("server-load: responses checked %d, wrong %d, non-2xx %d, socket errors %d (connect %d, read %d, write %d, timeout %d)\n",
    total_checked, total_wrong, e.status, socket_errors, e.connect, e.read, e.write, e.timeout))
  if example ~= "" then
    io.write("server-load: first wrong response: " .. example .. "\n")
  end

  local ok = summary.requests > 0 and total_wrong == 0 and e.status == 0 and socket_errors == 0
    and total_checked == summary.requests
  io.write(ok and "server-load: PASS\n" or "server-load: FAIL\n")
end
