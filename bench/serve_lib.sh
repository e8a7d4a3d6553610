# Sourced by the bench scripts that drive `kvllm serve` (sh).
# start_server ARGS...: starts "$BIN serve --port 0 ARGS" in the background,
# waits for its "listening on" line (10 s at most) and sets PID, PORT, URL and
# SERVER_LOG; the server is stopped and its log removed when the script exits.
start_server() {
  SERVER_LOG=$(mktemp)
  "$BIN" serve --port 0 "$@" 2>"$SERVER_LOG" &
  PID=$!
  trap 'kill $PID 2>/dev/null; rm -f "$SERVER_LOG"' EXIT
  PORT=
  for _ in $(seq 100); do
    PORT=$(sed -n 's/.*listening on http:\/\/[^:]*:\([0-9]*\).*/\1/p' "$SERVER_LOG")
    [ -n "$PORT" ] && break
    sleep 0.1
  done
  [ -n "$PORT" ] || { cat "$SERVER_LOG"; exit 1; }
  URL="http://127.0.0.1:$PORT"
}
