"""The Grafana dashboard (docs/monitoring/gnnserve-dashboard.json) against what servers export:
each panel's metric names must be on a real server's /metrics, the deployment modes' rows on a
server of that mode (checked at the end of each mode's served test)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx

DASHBOARD = Path(__file__).resolve().parents[1] / "docs" / "monitoring" / "gnnserve-dashboard.json"
_NAME = re.compile(r"\bgnnserve_[a-z0-9_]+")


def dashboard_metrics(mode: str | None) -> set[str]:
    """Metric names the panels use: those of the rows of deployment ``mode`` (the row's
    description names it), or of every other row when None."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    names: set[str] = set()
    row_mode: str | None = None
    for panel in panels:
        if panel["type"] == "row":
            row_mode = panel.get("description", "").removeprefix("gnnserve serve --deploy ") or None
            continue
        if row_mode == mode:
            for target in panel["targets"]:
                names.update(_NAME.findall(target["expr"]))
    return names


def exported_names(exposition: str) -> set[str]:
    """The sample names of an exposition text (``x_bucket``, ``x_total``, ...)."""
    lines = exposition.splitlines()
    return {
        re.split(r"[{ ]", line, maxsplit=1)[0] for line in lines if line.startswith("gnnserve_")
    }


def assert_dashboard_metrics_exported(base: str, mode: str | None) -> None:
    """Every metric the dashboard's ``mode`` rows use is on ``base``'s /metrics."""
    used = dashboard_metrics(mode)
    assert used, f"the dashboard has no panel for {mode!r}"
    text = httpx.get(f"{base}/metrics", timeout=30).text
    missing = sorted(used - exported_names(text))
    assert not missing, f"dashboard metrics a {mode or 'local'} server does not export: {missing}"
