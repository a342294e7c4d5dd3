"""Helpers of tests/test_dashboards.py: a live local campaign made to light up every dashboard panel,
a real Prometheus scraping it, and the Grafana-side logic the tests imitate (variable substitution,
walking a dashboard's panels).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from tinytask import make_tiny_task

REPO = Path(__file__).resolve().parent.parent
DASHBOARDS = REPO / "dashboards"
RULES = DASHBOARDS / "rules.yaml"
RULES_TEST = DASHBOARDS / "rules_test.yaml"
OPERATOR_JOB = "labkube-operator"  # the scrape job the operator alerts name

CAMPAIGN = "monitoring"
# A Gaia2 scenario (in ARE's world, judged by ARE) beside the paper task: the Gaia2 dashboard's series.
GAIA2_TASK = "gaia2/execution_budget_email"
GAIA2_CAPABILITY = "execution"
# Every step sleeps, so that the two runs (one at a time: one fake GPU) last about ten seconds each.
# Seed 0 edits the grader (the integrity audit finds it SUSPICIOUS); seed 1 kills its own agent process
# once (the supervisor resumes it from its checkpoint: resumes and restarts); a read of a missing file
# is a failed tool call. Plans substitute {{seed}}.
PLAN: list[dict[str, Any]] = [
    {"tool": "bash", "args": {"command": "echo 2 > result.txt; sleep 2"}},
    {"tool": "read_file", "args": {"path": "notes.txt"}},
    {
        "tool": "bash",
        "args": {
            "command": "if [ {{seed}} = 0 ]; then echo '# tuned' >> grading/grade.sh; fi; echo 5 > result.txt; sleep 2"
        },
    },
    {
        "tool": "bash",
        "args": {
            "command": "if [ {{seed}} = 1 ] && [ ! -e .crashed ]; then touch .crashed; kill -9 $PPID; fi; sleep 2"
        },
    },
    {"tool": "read_file", "args": {"path": "missing.txt"}},
    {"tool": "bash", "args": {"command": "echo 8 > result.txt; sleep 2"}},
]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_campaign(root: Path) -> tuple[Path, Path]:
    """A tiny task that needs a GPU, has every budget, and is graded every 2 s, and a Gaia2 scenario; a campaign
    file running both with two seeds, a price for the oracle (so it costs money) and a GPU-hour cap. Concurrency 3:
    the one fake GPU runs the paper task's seeds one at a time, beside the Gaia2 runs. Returns (task, file)."""
    task = make_tiny_task(
        root,
        PLAN,
        resources={"gpus": 1},
        budgets={"wall_hours": 0.02, "tokens": 20000, "usd": 2.0, "steps": 30},
        grading={"summary": "grading/results.json", "timeout_s": 30, "interval_s": 2},
    )
    spec = {
        "name": CAMPAIGN,
        "tasks": [str(task), GAIA2_TASK],
        "models": ["oracle"],
        "seeds": 2,
        "concurrency": 3,
        "gpu_hours_cap": 1.0,
        "prices": {"oracle": [100.0, 100.0]},
        # seed 1's command kills its own harness ($PPID), which only an unsandboxed run can reach (docs/sandbox.md)
        "sandbox": "none",
    }
    path = root / "campaign.yaml"
    path.write_text(yaml.safe_dump(spec))
    return task, path


# -- processes ------------------------------------------------------------------------------------


def start_group(
    cmd: list[str], log: Path, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    """A subprocess in a process group of its own, output to `log`."""
    with log.open("wb") as out:
        return subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )


def stop_group(proc: subprocess.Popen[bytes], signals: tuple[tuple[int, float], ...]) -> None:
    """Signal the process's group with each (signal, seconds to wait) in turn until it has exited."""
    for sig, wait_s in signals:
        if proc.poll() is not None:
            break
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait_s)
    # whatever the leader left behind in its group goes too
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


# -- Prometheus -----------------------------------------------------------------------------------


class PrometheusError(RuntimeError):
    pass


@dataclass
class Prometheus:
    """A real Prometheus server on loopback, scraping `targets` every second and evaluating our rules."""

    root: Path
    targets: list[str]
    binary: str = "/usr/bin/prometheus"
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.root / "prometheus.log"

    def start(self, timeout_s: float = 30) -> None:
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [{"job_name": OPERATOR_JOB, "static_configs": [{"targets": self.targets}]}],
        }
        (self.root / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.proc = start_group(
            [
                self.binary,
                f"--config.file={self.root / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.root / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            self.log,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise PrometheusError(f"prometheus exited {self.proc.returncode}:\n{tail(self.log)}")
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:
                if r.status == 200:
                    return
            time.sleep(0.2)
        raise PrometheusError(f"prometheus not ready after {timeout_s} s:\n{tail(self.log)}")

    def stop(self) -> None:
        if self.proc is not None:
            stop_group(self.proc, ((signal.SIGTERM, 10),))

    def wait_for_rules_evaluated_after(self, moment: float, timeout_s: float = 15) -> None:
        """Until every rule group has been evaluated after `moment` (a Unix time), or the deadline."""
        deadline = time.monotonic() + timeout_s
        while True:
            groups = self.api("rules")["groups"]
            evaluated = [_unix_time(g["lastEvaluation"]) for g in groups]
            if groups and min(evaluated) > moment:
                return
            if time.monotonic() > deadline:
                raise PrometheusError(f"rules not all evaluated {timeout_s:g} s after {moment}: {evaluated}")
            time.sleep(0.2)

    def api(self, path: str, **params: str | float | list[str]) -> Any:
        query = urllib.parse.urlencode(params, doseq=True)
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=30) as r:
                body = json.loads(r.read())
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read() or b"{}")
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def instant(self, expr: str, at: float) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.api("query", query=expr, time=at)["result"]
        return result

    def range(self, expr: str, start: float, end: float, step: float = 1) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.api("query_range", query=expr, start=start, end=end, step=step)["result"]
        return result

    def series(self, match: str, start: float, end: float) -> list[dict[str, str]]:
        params: dict[str, str | float | list[str]] = {"match[]": [match], "start": start, "end": end}
        found: list[dict[str, str]] = self.api("series", **params)
        return found


def _unix_time(rfc3339: str) -> float:
    """Prometheus's RFC 3339 times carry nanoseconds; Python's parser takes at most microseconds."""
    whole, _, fraction = rfc3339.removesuffix("Z").partition(".")
    return datetime.fromisoformat(whole).replace(tzinfo=UTC).timestamp() + float(f"0.{fraction or 0}")


def has_finite_value(result: list[dict[str, Any]]) -> bool:
    """Whether an instant or range query result holds at least one number (NaN is no data for a panel)."""
    for series in result:
        points = series.get("values") or ([series["value"]] if "value" in series else [])
        for _ts, value in points:
            if value not in ("NaN", "+Inf", "-Inf"):
                return True
    return False


# -- the campaign scraper -------------------------------------------------------------------------


class Scraper(threading.Thread):
    """Keeps every successful scrape of `url` (what `promtool check metrics` reads), until stopped."""

    def __init__(self, url: str, every_s: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.url, self.every_s = url, every_s
        self.scrapes: list[str] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            with contextlib.suppress(OSError), urllib.request.urlopen(self.url, timeout=2) as r:
                self.scrapes.append(r.read().decode())
            self.halt.wait(self.every_s)


# -- Grafana's side -------------------------------------------------------------------------------


def grafana_regex_escape(value: str) -> str:
    """How Grafana's Prometheus data source writes one value of a multi-value variable into a query
    (`prometheusSpecialRegexEscape`): regex metacharacters get a backslash, itself escaped for PromQL."""
    value = value.replace("\\", "\\\\\\\\")
    return re.sub(r"[$^*{}\[\]'+?.()|]", lambda m: "\\\\" + m.group(0), value)


def substitute(expr: str, values: dict[str, str]) -> str:
    """Replace `$name` and `${name}` (longest names first) as Grafana does before sending a query."""
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", values[name]).replace("$" + name, values[name])
    return expr


def load_dashboards() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows' nested panels included (rows themselves too)."""
    for p in dashboard.get("panels", []):
        yield p
        yield from p.get("panels", [])


def queries(dashboard: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(panel, target) for every query of every panel."""
    for p in panels(dashboard):
        for t in p.get("targets", []):
            yield p, t


def variables(dashboard: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in dashboard.get("templating", {}).get("list", [])}


METRIC_NAME = re.compile(r"\b(?:[a-z_]+:[a-z0-9_:]+|labkube_[a-z0-9_]+|up|ALERTS)\b")


def series_names(expr: str) -> set[str]:
    """Metric and recording-rule names an expression reads (labkube_*, level:metric:operation, up)."""
    without_strings = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    return set(METRIC_NAME.findall(without_strings))


def rule_groups() -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = yaml.safe_load(RULES.read_text())["groups"]
    return groups


def recording_rules() -> dict[str, str]:
    return {r["record"]: r["expr"] for g in rule_groups() for r in g["rules"] if "record" in r}


def alerting_rules() -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in rule_groups() for r in g["rules"] if "alert" in r}
