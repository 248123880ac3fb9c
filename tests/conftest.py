"""Shared test set-up: Ray listens on loopback only and sends no usage stats."""

from __future__ import annotations

import os

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
