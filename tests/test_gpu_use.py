"""GPU use per run (issue #23, item 7): NVML readings become the run's series, its result's `gpu`, and the
reports' "mean utilisation, peak memory"; a run without a GPU shows "no GPU", never 0 %.

NVML itself is the thin layer (`agent/harness/gpu.py: NvmlSource`); everything after it runs here on readings in the
recorder's format (`tests/data/nvml/one-gpu-training.jsonl`: recorded by `benchmarks/gpu_check.sh --record` on
an H200 while a run trained a small PyTorch model: idle at 615 MiB, utilisation ~97 % with about 6 then 13 GiB
held, then idle again; docs/task-environments.md has that run's figures). The real `pynvml` is called where it
can be: on a machine without a GPU it must report none.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from cli_helpers import labkube
from prometheus_client import generate_latest
from tinytask import make_tiny_task

from labkube.agent.harness.gpu import (
    MAX_POINTS,
    GpuMeter,
    GpuReading,
    ReplaySource,
    add_sample,
    open_source,
    run_devices,
    start_gpu_meter,
)
from labkube.agent.telemetry import RunTelemetry
from labkube.result import GpuUse
from labkube.run_spec import RunSpec

RECORDED = Path(__file__).parent / "data" / "nvml" / "one-gpu-training.jsonl"
GIB = 2**30


def recorded() -> list[list[GpuReading]]:
    return ReplaySource(RECORDED).samples


def spec(gpus: int = 1) -> RunSpec:
    return RunSpec(run_id="t--m--s0", campaign="c", task="t", task_path="/t", model="m", seed=0, gpus=gpus)


def gpu_series(telemetry: RunTelemetry) -> dict[str, dict[str, float]]:
    """`labkube_run_gpu_*` sample name -> {gpu label: value}, as Prometheus would scrape them."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, dict[str, float]] = {}
    text = generate_latest(telemetry.m.registry).decode()  # type: ignore[arg-type]
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("labkube_run_gpu_"):
                out.setdefault(s.name, {})[s.labels["gpu"]] = s.value
    return out


def test_the_runs_gpus_are_what_cuda_visible_devices_names() -> None:
    assert run_devices("0,1", 2) == ["0", "1"]
    assert run_devices("GPU-8c1e2f0a-1111-2222-3333-444455556666", 1) == ["GPU-8c1e2f0a-1111-2222-3333-444455556666"]
    assert run_devices(None, 1) == []  # a pod: every GPU NVML sees is the run's
    assert run_devices("", 1) is None and run_devices("0", 0) is None


def test_recorded_readings_give_the_runs_series_and_its_mean_and_peak(tmp_path: Path) -> None:
    telemetry = RunTelemetry(spec())
    assert gpu_series(telemetry) == {}, "no series before the first reading"
    meter = GpuMeter(tmp_path, ReplaySource(RECORDED), telemetry, interval_s=1.0)
    samples = recorded()
    for _ in samples:
        meter.sample()
    use = GpuUse.model_validate_json((tmp_path / "gpu.json").read_text())
    assert use.devices == ["0"] and use.samples == len(samples)
    expected_mean = sum(s[0].utilization_gpu for s in samples) / 100 / len(samples)
    assert use.mean_utilization == pytest.approx(expected_mean)
    assert use.peak_memory_bytes == max(s[0].memory_used for s in samples) > 12 * GIB
    assert use.memory_total_bytes == samples[0][0].memory_total
    assert [round(p.utilization * 100) for p in use.curve] == [s[0].utilization_gpu for s in samples]
    series = gpu_series(telemetry)
    assert series["labkube_run_gpu_utilization_ratio"] == {"0": samples[-1][0].utilization_gpu / 100}
    assert series["labkube_run_gpu_memory_used_bytes"] == {"0": samples[-1][0].memory_used}
    assert series["labkube_run_gpu_memory_total_bytes"] == {"0": samples[-1][0].memory_total}


class FallenOffTheBus:
    """A GPU source whose device is gone after the first reading (NVML raises then)."""

    def __init__(self) -> None:
        self.devices, self.reads = ["0"], 0
        self.inner = ReplaySource(RECORDED)

    def read(self) -> list[GpuReading]:
        self.reads += 1
        if self.reads > 1:
            raise RuntimeError("GPU is lost")
        return self.inner.read()


def test_a_gpu_that_fails_is_logged_once_with_the_run_and_its_last_values_stay(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = FallenOffTheBus()
    meter = GpuMeter(tmp_path, source, RunTelemetry(spec()), interval_s=0.01).start()
    deadline = time.monotonic() + 10
    while source.reads < 5:
        assert time.monotonic() < deadline, f"the meter stopped sampling after {source.reads} reads"
        time.sleep(0.01)
    use = meter.stop()
    assert use.samples == 1
    failures = [r.getMessage() for r in caplog.records if r.name == "labkube.agent.harness.gpu"]
    assert failures == [f"run {tmp_path}: GPU sampling failed, last values kept: RuntimeError: GPU is lost"]


def test_a_resumed_run_goes_on_from_its_earlier_samples(tmp_path: Path) -> None:
    first = GpuMeter(tmp_path, ReplaySource(RECORDED), RunTelemetry(spec()), interval_s=1.0)
    for _ in range(3):
        first.sample()
    again = GpuMeter(tmp_path, ReplaySource(RECORDED), RunTelemetry(spec()), interval_s=1.0)
    again.sample()
    assert again.use.samples == 4
    assert again.use.curve[-1].at_seconds >= again.use.curve[-2].at_seconds


def test_a_long_run_keeps_a_short_curve_with_its_peak() -> None:
    use = GpuUse(devices=["0"])
    quiet = [GpuReading(device="0", utilization_gpu=10, memory_used=GIB, memory_total=80 * GIB)]
    spike = [GpuReading(device="0", utilization_gpu=100, memory_used=70 * GIB, memory_total=80 * GIB)]
    for i in range(2000):
        use = add_sample(use, spike if i == 1234 else quiet, float(i))
    assert use.samples == 2000 and len(use.curve) <= MAX_POINTS
    assert max(p.memory_used_bytes for p in use.curve) == use.peak_memory_bytes == 70 * GIB
    assert use.mean_utilization == pytest.approx((1999 * 0.1 + 1.0) / 2000)


def test_without_a_gpu_nvml_gives_no_source_and_the_run_no_series(tmp_path: Path, monkeypatch) -> None:
    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has a GPU: benchmarks/gpu_check.sh checks NVML there")
    monkeypatch.delenv("LABKUBE_GPU_REPLAY", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert open_source(["0"]) is None  # the real pynvml: NVMLError_LibraryNotFound
    telemetry = RunTelemetry(spec())
    assert start_gpu_meter(tmp_path, 1, telemetry) is None
    assert gpu_series(telemetry) == {}
    assert not (tmp_path / "gpu.json").exists()


WORK = [{"tool": "bash", "args": {"command": "sleep 0.4; echo 3 > result.txt"}}] * 3


def test_reports_show_gpu_use_and_no_gpu(tmp_path: Path) -> None:
    """Through the CLI: a one-GPU run (a fake Ray GPU, NVML replayed) and a run without GPUs, in one campaign."""
    gpu_task = make_tiny_task(tmp_path / "a", WORK, resources={"gpus": 1})
    gpu_task = gpu_task.rename(tmp_path / "a" / "tiny-gpu")
    cpu_task = make_tiny_task(tmp_path / "b", WORK)
    out = tmp_path / "campaign"
    env = {"LABKUBE_LOCAL_GPUS": "1", "LABKUBE_GPU_REPLAY": str(RECORDED), "LABKUBE_GPU_SAMPLE_S": "0.05"}
    run = labkube("run", str(gpu_task), str(cpu_task), "--out", str(out), cwd=tmp_path, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = {r["task"]: r for r in json.loads(labkube("report", str(out), "--format", "json", cwd=tmp_path).stdout)}
    gpu_row, cpu_row = rows[str(gpu_task)], rows[str(cpu_task)]
    assert 0 < gpu_row["gpu_utilization"] <= 1 and gpu_row["gpu_memory_peak_bytes"] > 0
    assert cpu_row["gpu_utilization"] is None and cpu_row["gpu_memory_peak_bytes"] is None
    result = json.loads(next(out.glob("runs/tiny-gpu--*/result.json")).read_text())
    assert result["gpu"]["samples"] >= 2 and result["gpu"]["devices"] == ["0"]

    # mean utilisation · the peak of the readings the run's meter took (the replay's first lines: the run is short)
    mean = f"{gpu_row['gpu_utilization']:.0%} · {result['gpu']['peak_memory_bytes'] / GIB:.1f} GiB"
    table = labkube("report", str(out), cwd=tmp_path).stdout
    assert "no GPU" in table and mean in table
    status = labkube("status", str(out), cwd=tmp_path).stdout
    assert "no GPU" in status and mean in status
    html_out = tmp_path / "report.html"
    assert labkube("report", str(out), "--format", "html", "--out", str(html_out), cwd=tmp_path).returncode == 0
    page = html_out.read_text()
    assert page.count('class="plot gpu-plot"') == 1, "a GPU plot for the task whose run had a GPU, none for the other"
    assert 'aria-label="GPU use of' in page and "no GPU" in page and mean in page
