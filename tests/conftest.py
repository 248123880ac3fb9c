"""Shared test set-up: Ray listens on loopback only and sends no usage stats; raybus keeps its
default storage in a temporary directory removed when the session ends."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

from hypothesis import settings

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"

# Subprocesses started by tests (examples, second clients) inherit this too.
_STORAGE = tempfile.mkdtemp(prefix="raybus-test-storage-")
os.environ["RAYBUS_STORAGE_PATH"] = _STORAGE
atexit.register(shutil.rmtree, _STORAGE, ignore_errors=True)

# No per-example deadline for hypothesis (the default 200 ms): an example takes about 1 ms,
# but one pause of a loaded 2-core CI machine in hundreds of examples failed a whole test.
settings.register_profile("raybus", deadline=None)
settings.load_profile("raybus")

# Helpers shared by several test folders (not a package: tests import them by module name).
sys.path.insert(0, str(Path(__file__).parent / "helpers"))
