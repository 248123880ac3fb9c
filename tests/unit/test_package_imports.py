"""The package's public names load on first use, so that broker actors (each a Ray worker
process importing ``raybus._actors...``) do not import the client API."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import raybus


def test_every_public_name_resolves_to_its_defining_object() -> None:
    from raybus import _sync_client, aio, auth, enums, management, message

    assert raybus.ServiceBusClient is _sync_client.ServiceBusClient
    assert raybus.EntityInfo is aio.EntityInfo
    assert raybus.ServiceBusSubQueue is enums.ServiceBusSubQueue
    assert raybus.ServiceBusAdministrationClient is management.ServiceBusAdministrationClient
    assert raybus.ServiceBusMessage is message.ServiceBusMessage
    # The SDK's name for what raybus.auth calls connection_string_properties.
    assert raybus.parse_connection_string is auth.connection_string_properties
    for name in raybus.__all__:
        assert getattr(raybus, name) is not None, name
    assert set(raybus.__all__) <= set(dir(raybus))
    assert raybus.aio.ServiceBusClient is aio.ServiceBusClient  # subpackage as an attribute


def test_the_type_checkers_imports_name_what_the_lazy_table_loads() -> None:
    """The names type checkers see (the ``TYPE_CHECKING`` imports) and the names loaded on
    first use (``_EXPORTS`` and ``_RENAMED``) are two lists of one thing: they must not drift
    apart."""
    tree = ast.parse(Path(raybus.__file__).read_text())
    (block,) = [
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
    ]
    static = {
        alias.asname or alias.name: (f".{node.module}", alias.name)
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    for node in block.body:  # ``public = _imported``: a name the SDK spells otherwise
        if isinstance(node, ast.Assign):
            (target,) = node.targets
            static[ast.unparse(target)] = static.pop(ast.unparse(node.value))
    assert static == raybus._HOMES  # public name -> (module, its name there)


def test_an_unknown_name_is_an_attribute_error_naming_it() -> None:
    with pytest.raises(AttributeError, match="NoSuchThing"):
        raybus.NoSuchThing  # noqa: B018


def test_star_import_gives_the_public_api() -> None:
    scope: dict[str, object] = {}
    exec("from raybus import *", scope)
    assert {"ServiceBusClient", "ServiceBusMessage", "connect"} <= set(scope)


# What a Ray worker process imports first: the module of the class it hosts.
WORKER_ENTRY_MODULES = (
    "raybus._actors.namespace",
    "raybus._actors.partition",
    "raybus._actors.router",
    "raybus._actors.coordinator",
    "raybus._actors.replica",
    "raybus.http._app",
)


def test_each_actor_module_imports_first_in_a_fresh_process() -> None:
    # Nothing loads the package's other modules beforehand any more: an import cycle that
    # the old eager order hid (a processor replica died on one) shows up here.
    code = (
        "import importlib, sys\n"
        f"for name in {WORKER_ENTRY_MODULES!r}:\n"
        "    for loaded in [m for m in sys.modules if m.split('.')[0] == 'raybus']:\n"
        "        del sys.modules[loaded]\n"
        "    importlib.import_module(name)\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr[-3000:]


def test_the_actor_modules_do_not_import_the_client_api() -> None:
    code = (
        "import sys, raybus._actors.partition, raybus._actors.namespace;"
        "print(sorted(m for m in ('raybus.aio', 'raybus._sync_client', 'raybus.management',"
        " 'raybus.message') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
