"""cluster/grafana-dashboard.json queries only metrics that raybus exports, under Ray's names.

Ray's Prometheus export prefixes application metrics with ``ray_`` (``raybus_messages_sent_total``
is scraped as ``ray_raybus_messages_sent_total``) and histograms add ``_bucket`` series. The
dashboard is not run against Grafana here; these checks keep its queries in step with
``raybus/_metrics.py``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from raybus import _metrics

DASHBOARD = Path(__file__).resolve().parents[2] / "cluster" / "grafana-dashboard.json"
RAY_PREFIX = "ray_"
_NAME = re.compile(r"\b(?:ray_)?raybus_[a-z0-9_]+")


def _exported() -> set[str]:
    names = set(_metrics.COUNTERS.values()) | set(_metrics.GAUGES.values())
    names |= {name for name, _bounds in _metrics.HISTOGRAMS.values()}
    names.add("raybus_transactions_total")  # count_transaction's counter
    return names


def _load() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))  # collapsed rows nest their panels


def _queries(dashboard: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in _panels(dashboard["panels"]) for t in p.get("targets", [])]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]
            exprs.append(query["query"] if isinstance(query, dict) else query)
    return exprs


def _base_name(name: str) -> str:
    name = name.removeprefix(RAY_PREFIX)
    histograms = {n for n, _bounds in _metrics.HISTOGRAMS.values()}
    if name.endswith("_bucket") and name.removesuffix("_bucket") in histograms:
        name = name.removesuffix("_bucket")
    return name


def test_every_metric_in_the_dashboard_queries_is_exported_by_raybus() -> None:
    exported = _exported()
    referenced = {m for expr in _queries(_load()) for m in _NAME.findall(expr)}
    assert referenced, "the dashboard queries no raybus metric"
    unknown = sorted(m for m in referenced if _base_name(m) not in exported)
    assert not unknown, f"not in raybus._metrics: {unknown}"


def test_dashboard_uses_the_names_ray_exports_with_its_ray_prefix() -> None:
    referenced = {m for expr in _queries(_load()) for m in _NAME.findall(expr)}
    assert all(m.startswith(RAY_PREFIX) for m in referenced), sorted(referenced)


def test_every_exported_metric_has_a_panel() -> None:
    referenced = {
        _base_name(m)
        for p in _panels(_load()["panels"])
        for t in p.get("targets", [])
        for m in _NAME.findall(t["expr"])
    }
    assert _exported() - referenced == set()


def test_histogram_panels_take_quantiles_over_bucket_series() -> None:
    histograms = {n for n, _bounds in _metrics.HISTOGRAMS.values()}
    for expr in _queries(_load()):
        for m in _NAME.findall(expr):
            if m.removeprefix(RAY_PREFIX).removesuffix("_bucket") in histograms:
                assert m.endswith("_bucket") and "histogram_quantile(" in expr, expr


def test_datasource_and_template_variables() -> None:
    dashboard = _load()
    assert 36 <= dashboard["schemaVersion"] <= 41
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    for name in ("namespace", "entity"):
        query = variables[name]["query"]
        text = query["query"] if isinstance(query, dict) else query
        assert text.startswith("label_values(ray_raybus_active_messages"), text
        assert text.rstrip(")").endswith(f", {name}"), text
    panels = list(_panels(dashboard["panels"]))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
            if "transactions_total" not in target["expr"]:  # tagged namespace and outcome only
                assert 'entity=~"$entity"' in target["expr"], target["expr"]
            assert 'namespace=~"$namespace"' in target["expr"], target["expr"]
