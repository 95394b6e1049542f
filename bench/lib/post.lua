-- wrk script for the forwarding benchmark: one small routed verb on a cached sandbox name (the
-- path comes from the URL). The token and name come from the environment the harness sets
-- (BENCH_TOKEN, BENCH_NAME), so one script drives the node, the gateway and nginx.
wrk.method = "POST"
wrk.body = '{"name":"' .. (os.getenv("BENCH_NAME") or "bench-1") .. '"}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. (os.getenv("BENCH_TOKEN") or "")
