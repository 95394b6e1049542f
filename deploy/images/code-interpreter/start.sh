#!/bin/bash
# Starts the code interpreter's server (server.py, port 49999) in the background, detached from
# this script, and exits 0 once /health answers: the node runs it when it creates a sandbox of
# this image (the image's `dormice.start` label) and hands the sandbox out only after it exited 0.
# Running it again while the server answers does nothing. Its log: /tmp/.dormice-code-interpreter.log
set -u
port="${DORMICE_CODE_INTERPRETER_PORT:-49999}"
log=/tmp/.dormice-code-interpreter.log
health() { curl -sf -o /dev/null --max-time 2 "http://127.0.0.1:$port/health"; }
health && exit 0
cd "$HOME" 2>/dev/null || cd /
setsid nohup python3 /opt/dormice/code-interpreter/server.py >"$log" 2>&1 </dev/null &
server=$!
# The kernel takes about a second; a loaded machine more. Bounded: 60 s.
for _ in $(seq 1 600); do
  health && exit 0
  if ! kill -0 "$server" 2>/dev/null; then
    echo "code-interpreter: the server exited before it answered; its log says:" >&2
    tail -n 20 "$log" >&2
    exit 1
  fi
  sleep 0.1
done
echo "code-interpreter: the server did not answer on port $port within 60 s; its log says:" >&2
tail -n 20 "$log" >&2
exit 1
