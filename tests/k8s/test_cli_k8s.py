"""`labkube run --backend k8s`: the CLI creates a Campaign resource and follows it; bad contexts fail in one line."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest
import yaml
from conftest import Cluster, eventually, tiny_task
from test_operator import READ, WRITE, condition, phase

from labkube.run_spec import RunSpec
from labkube.store import CampaignDir


def kubeconfig(path: Path, server: str, name: str = "fake") -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": name, "cluster": {"server": server}}],
                "users": [{"name": name, "user": {"token": "not-checked"}}],
                "contexts": [{"name": name, "context": {"cluster": name, "user": name, "namespace": "default"}}],
                "current-context": name,
            }
        )
    )
    return path


async def labkube_async(*args: str, env: dict[str, str], cwd: Path, timeout: float = 120) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-P", "-m", "labkube", *args,
        cwd=cwd, env={**os.environ, "COLUMNS": "200", **env},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    return proc.returncode or 0, out.decode(), err.decode()


@pytest.mark.slow
async def test_run_with_the_k8s_backend_creates_a_campaign_and_follows_it(cluster: Cluster) -> None:
    task = tiny_task(cluster.root, "clitask", [WRITE, READ])
    config = kubeconfig(cluster.root / "kubeconfig", cluster.url)
    async with cluster.operator():
        code, out, err = await labkube_async(
            "run", str(task), "--backend", "k8s", "--kube-context", "fake", "--namespace", "default",
            "--seeds", "2", "--name", "from-cli",
            env={"KUBECONFIG": str(config)}, cwd=cluster.root,
        )  # fmt: skip
    assert code == 0, err + out
    assert "created Campaign from-cli in namespace default" in out
    assert "results: the campaign directory default/from-cli/" in out
    assert "clitask--oracle--s0" in out and "Finished" in out
    campaign = cluster.get_campaign("from-cli")
    assert campaign is not None and campaign["spec"]["backend"] == "k8s" and campaign["status"]["phase"] == "Finished"
    cdir = CampaignDir(cluster.campaign_dir("from-cli"))
    assert all(cdir.is_finished(i) for i in cdir.run_ids()) and len(cdir.run_ids()) == 2


def run_cli(*args: str, env: dict[str, str], cwd: Path) -> tuple[int, str, str]:
    import subprocess

    proc = subprocess.run(
        [sys.executable, "-P", "-m", "labkube", *args],
        cwd=cwd, env={**os.environ, "COLUMNS": "200", **env}, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    return proc.returncode, proc.stdout, proc.stderr


def test_an_unknown_kube_context_is_a_one_line_error(tmp_path: Path) -> None:
    config = kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:9")
    code, out, err = run_cli(
        "run", "researchgym/continual-learning-lite", "--backend", "k8s", "--kube-context", "nope",
        env={"KUBECONFIG": str(config)}, cwd=tmp_path,
    )  # fmt: skip
    assert code == 2, out + err
    assert "kube context `nope` not found" in err and "(contexts: fake)" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 3


def test_an_unreachable_cluster_is_a_one_line_error(tmp_path: Path) -> None:
    config = kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:9")
    code, out, err = run_cli(
        "run", "researchgym/continual-learning-lite", "--backend", "k8s", "--kube-context", "fake",
        env={"KUBECONFIG": str(config)}, cwd=tmp_path,
    )  # fmt: skip
    assert code == 2, out + err
    assert "cannot reach the Kubernetes API at http://127.0.0.1:9 (context fake)" in err
    assert "Traceback" not in err


def test_local_only_options_are_refused_with_the_k8s_backend(tmp_path: Path) -> None:
    code, _, err = run_cli(
        "run", "researchgym/continual-learning-lite", "--backend", "k8s", "--out", "x", env={}, cwd=tmp_path
    )
    assert code == 2 and "--out is for the local backend" in err


@pytest.mark.slow
async def test_run_with_the_k8s_backend_carries_the_overlay_to_the_pods(cluster: Cluster) -> None:
    """`--overlay` is read by the CLI and travels as content: Campaign, Run, the pod's run.json, its grade. A bad
    overlay in another Campaign fails that one in one line and nothing else."""
    task = tiny_task(cluster.root, "overlaid", [WRITE, READ])
    overlay = {"subtasks": [{"id": "score", "sota": 12.0}], "budgets": {"steps": 40}}
    (cluster.root / "overlays").mkdir()
    (cluster.root / "overlays" / "overlaid.yaml").write_text(yaml.safe_dump(overlay))
    config = kubeconfig(cluster.root / "kubeconfig", cluster.url)
    async with cluster.operator():
        bad = {"overlaid": {"subtasks": [{"id": "score", "sotta": 1}]}}
        cluster.campaign("bad-overlay", tasks=[str(task)], models=["oracle"], task_overlays=bad)
        code, out, err = await labkube_async(
            "run", str(task), "--backend", "k8s", "--kube-context", "fake", "--namespace", "default",
            "--name", "overlaid", "--overlay", "overlays",
            env={"KUBECONFIG": str(config)}, cwd=cluster.root,
        )  # fmt: skip
        assert code == 0, err + out
        await eventually(lambda: phase(cluster, "bad-overlay") == "Failed", 30, what="the bad campaign to fail")

    campaign = cluster.get_campaign("overlaid")
    assert campaign is not None and campaign["status"]["phase"] == "Finished"
    assert campaign["spec"]["task_overlays"] == {"overlaid": overlay} and "overlay" not in campaign["spec"]
    (run,) = cluster.runs("overlaid")
    assert run["spec"]["task_overlay"] == overlay and run["spec"]["budgets"]["steps"] == 40
    (pod_name,) = cluster.agent_pods_created("overlaid")
    pod = cluster.created_pod(pod_name)
    envs = [e for c in pod["spec"].get("initContainers", []) + pod["spec"]["containers"] for e in c.get("env", [])]
    (spec_json,) = {e["value"] for e in envs if e["name"] == "LABKUBE_RUN_SPEC"}
    assert RunSpec.model_validate_json(spec_json).task_overlay == overlay
    cdir = CampaignDir(cluster.campaign_dir("overlaid"))
    (run_id,) = cdir.run_ids()
    result = cdir.result(run_id)
    assert result is not None and result.status.value == "Finished"
    (score,) = result.subtasks
    assert score.raw == 6.0 and score.fraction_of_sota == pytest.approx(0.5)  # 6 / 12 (the overlay), not 6 / 10

    failed = cluster.get_campaign("bad-overlay")
    assert failed is not None
    ready = condition(failed, "Ready")
    assert ready is not None and ready["reason"] == "InvalidOverlay"
    assert ready["message"] == (
        "Campaign bad-overlay: task overlaid: campaign overlay for overlaid: "
        "subtasks.0.sotta: unknown key (did you mean `sota`?)"
    )
    assert cluster.runs("bad-overlay") == [] and cluster.pods_created("bad-overlay") == []
