#!/usr/bin/env bash
# The raybus HTTP gateway from the shell: send, peek-lock, complete, unlock, renew, batch send,
# receive-and-delete -- the Service Bus REST runtime API with curl.
#
#   raybus http --port 8080 &                 # serve the namespace (Ctrl-C stops it)
#   raybus queue create orders
#   examples/http_curl.sh http://127.0.0.1:8080 orders
#
# With authorization rules on the namespace, put a SAS token in RAYBUS_SAS_TOKEN
# ("SharedAccessSignature sr=...&sig=...&se=...&skn=..."); an open namespace needs none.
set -euo pipefail

BASE=${1:-http://127.0.0.1:8080}
QUEUE=${2:-orders}
AUTH=()
if [[ -n "${RAYBUS_SAS_TOKEN:-}" ]]; then
  AUTH=(-H "Authorization: ${RAYBUS_SAS_TOKEN}")
fi

# curl with the token; -f makes an HTTP error (4xx/5xx) fail the script.
call() { curl -sS -f "${AUTH[@]}" "$@"; }
# The value of response header $1 in the headers file $2 (names are case-insensitive).
header() { grep -i "^$1:" "$2" | head -n 1 | cut -d' ' -f2- | tr -d '\r'; }

HEADERS=$(mktemp)
trap 'rm -f "$HEADERS"' EXIT

echo "== send one message: BrokerProperties for system properties, other headers are custom"
call -X POST "$BASE/$QUEUE/messages" \
  -H 'Content-Type: text/plain' \
  -H 'BrokerProperties: {"MessageId": "order-1", "Label": "order", "TimeToLive": 3600}' \
  -H 'Priority: "high"' -H 'Amount: 250' \
  --data-binary 'order 1' -o /dev/null -w 'status %{http_code}\n'

echo "== peek-lock it (waits up to 5 s for a message)"
call -X POST "$BASE/$QUEUE/messages/head?timeout=5" -D "$HEADERS" -o /dev/null \
  -w 'status %{http_code}\n'
echo "BrokerProperties: $(header BrokerProperties "$HEADERS")"
echo "Amount: $(header Amount "$HEADERS")  Priority: $(header Priority "$HEADERS")"
LOCATION=$(header Location "$HEADERS")
echo "Location: $LOCATION"

echo "== renew its lock, then unlock it (it comes back with DeliveryCount 2)"
call -X POST "$LOCATION" -o /dev/null -w 'renew status %{http_code}\n'
call -X PUT "$LOCATION" -o /dev/null -w 'unlock status %{http_code}\n'
call -X POST "$BASE/$QUEUE/messages/head?timeout=5" -D "$HEADERS" -o /dev/null \
  -w 'status %{http_code}\n'
echo "BrokerProperties: $(header BrokerProperties "$HEADERS")"

echo "== complete it (DELETE on its Location)"
call -X DELETE "$(header Location "$HEADERS")" -o /dev/null -w 'status %{http_code}\n'

echo "== send a batch (JSON) and take the messages with receive-and-delete"
call -X POST "$BASE/$QUEUE/messages" \
  -H 'Content-Type: application/vnd.microsoft.servicebus.json' \
  --data-binary '[{"Body": "order 2", "BrokerProperties": {"MessageId": "order-2"}},
                  {"Body": "order 3", "UserProperties": {"Amount": 30}}]' \
  -o /dev/null -w 'status %{http_code}\n'
for _ in 1 2; do
  BODY=$(call -X DELETE "$BASE/$QUEUE/messages/head?timeout=5")
  echo "received: $BODY"
done

echo "== the queue is empty now: 204 after the timeout"
call -X DELETE "$BASE/$QUEUE/messages/head?timeout=1" -o /dev/null -w 'status %{http_code}\n'
