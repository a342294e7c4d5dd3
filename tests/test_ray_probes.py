"""The chart's RayCluster sets its own readiness and liveness probes (`labkube.rayProbes`), so KubeRay injects none:
KubeRay's own, before Ray 2.53 and in KubeRay releases before its HTTP probes, run `bash -c "wget ... | grep
success"` (ray-operator/controllers/ray/utils/constant.go, `BaseWgetHealthCommand`), and the labkube image
(images/labkube.Dockerfile, FROM python:3.11-slim) has no wget. The chart's probes are httpGets, which need nothing
in the image. Checked here against real Ray nodes of the version the image installs (`ray start`, token
authentication on, as the chart's RayCluster has it): the path the rendered probes ask answers 200 on the port the
rendered rayStartParams give the dashboard agent, without a token (the kubelet sends none), on a head and a worker."""

from __future__ import annotations

import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml
from raynodes import LocalRayCluster

pytestmark = pytest.mark.slow

CHART = Path(__file__).resolve().parents[1] / "helm" / "labkube"
VALUES = {
    "rayCluster": {"enabled": True},
    "runs": {"workspace": {"existingClaim": "labkube-runs", "accessModes": ["ReadWriteMany"]}},
}


def ray_groups() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(rayStartParams, the Ray container) of the head group and of each worker group, as rendered."""
    rendered = helm_python.Chart.load(CHART).render(VALUES, name="labkube", namespace="labkube-system")
    cluster = yaml.safe_load(next(text for path, text in rendered.items() if path.endswith("raycluster.yaml")))
    groups = [cluster["spec"]["headGroupSpec"], *cluster["spec"]["workerGroupSpecs"]]
    return [(g["rayStartParams"], g["template"]["spec"]["containers"][0]) for g in groups]


def answer(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except OSError as exc:
        return 0, str(exc)


def test_the_rendered_probes_need_no_wget_and_pass_on_real_ray_nodes(tmp_path: Path) -> None:
    groups = ray_groups()
    assert len(groups) == 2
    probes: list[dict[str, Any]] = []
    for params, container in groups:
        for kind in ("readinessProbe", "livenessProbe"):
            probe = container[kind]
            assert "exec" not in probe, f"{container['name']}: {kind} runs a command in the image"
            assert probe["httpGet"]["port"] == int(params["dashboard-agent-listen-port"])
            probes.append(probe)
    (path,) = {p["httpGet"]["path"] for p in probes}

    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    cluster = LocalRayCluster(tmp_path / "ray", 1, env, {})
    try:
        for node, checks in ((cluster.head, ("raylet: success", "gcs: success")), (cluster.workers[0], ("raylet",))):
            url = f"http://127.0.0.1:{node.agent_port}{path}"
            deadline = time.monotonic() + 60  # the readiness probe's patience: 10 s + 10 x 5 s
            status, body = answer(url)
            while status != 200 and time.monotonic() < deadline:
                time.sleep(1)
                status, body = answer(url)
            assert status == 200, f"{url}: {status} {body[:300]}"
            assert all(check in body for check in checks), body
    finally:
        cluster.stop()
    assert not cluster.leftovers()
