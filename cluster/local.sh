#!/usr/bin/env bash
# A multi-node Ray cluster on 127.0.0.1 for raybus: start [--workers N] [--storage PATH] | status | stop.
# See cluster/local.py (this wrapper only picks the project's Python).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-}"
if [[ -z "$python" ]]; then
  if [[ -x "$here/../.venv/bin/python" ]]; then python="$here/../.venv/bin/python"; else python=python3; fi
fi
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="${RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER:-0}"
export RAY_USAGE_STATS_ENABLED="${RAY_USAGE_STATS_ENABLED:-0}"
exec "$python" "$here/local.py" "$@"
