"""GPU use per run, sampled from NVML for the run's own GPUs.

The run's GPUs are what `CUDA_VISIBLE_DEVICES` names (the local driver sets it from Ray's allocation); unset in
a run that asked for GPUs (a pod, where the device plugin shows the container only its own), every GPU NVML
sees. A run that asked for none, or a machine without NVML, has no GPU: no series, no `gpu` in the result, and
reports say "no GPU", never 0 %.

Layers, so that CI exercises all but the first with recorded readings:
- `NvmlSource`: the only code that calls `pynvml`, one raw `GpuReading` per GPU per sample;
- `ReplaySource`: readings recorded by `benchmarks/gpu_check.sh --record` (JSON lines), replayed in order
  (`LABKUBE_GPU_REPLAY=<file>`; the last one repeats);
- `GpuMeter`: turns readings into the run's series (`labkube_run_gpu_*`) and its `GpuUse`, kept in
  `<run>/gpu.json` across resumes and copied into `result.json`.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, Field

from labkube.result import GPU_USE_FILE as GPU_FILE
from labkube.result import GpuPoint, GpuUse
from labkube.settings import GPU_REPLAY, GPU_SAMPLE_S
from labkube.store import read_model, write_model

log = logging.getLogger(__name__)

REPLAY_VARIABLE = GPU_REPLAY.name
INTERVAL_VARIABLE = GPU_SAMPLE_S.name
DEFAULT_INTERVAL_S = GPU_SAMPLE_S.default
MAX_POINTS = 240


class GpuReading(BaseModel):
    """One GPU at one moment, as NVML reports it."""

    device: str = Field(description="The GPU as CUDA_VISIBLE_DEVICES names it (an index or a UUID).")
    utilization_gpu: int = Field(ge=0, le=100, description="nvmlDeviceGetUtilizationRates().gpu, percent.")
    memory_used: int = Field(ge=0, description="nvmlDeviceGetMemoryInfo().used, bytes.")
    memory_total: int = Field(ge=0, description="nvmlDeviceGetMemoryInfo().total, bytes.")


class GpuSource(Protocol):
    devices: list[str]

    def read(self) -> list[GpuReading]: ...


def run_devices(cuda_visible: str | None, gpus: int) -> list[str] | None:
    """The run's GPUs as CUDA names them; None for a run without GPUs. An empty list: all GPUs NVML sees."""
    if gpus <= 0:
        return None
    if cuda_visible is None:
        return []
    devices = [d.strip() for d in cuda_visible.split(",") if d.strip()]
    return devices or None  # "" or "-1": CUDA sees no GPU


def gpu_minor_numbers(gpus: int) -> list[int] | None:
    """The device minor numbers (`/dev/nvidia<minor>`) of the GPUs `CUDA_VISIBLE_DEVICES` names, for the run's
    sandbox to bind those nodes only; None where NVML cannot say (the sandbox then binds every GPU node)."""
    devices = run_devices(os.environ.get("CUDA_VISIBLE_DEVICES"), gpus)
    if not devices:
        return None
    try:
        source = NvmlSource(devices)
        return [int(source.nvml.nvmlDeviceGetMinorNumber(handle)) for handle in source.handles]
    except Exception:  # no driver, no pynvml, a name NVML does not know: not told apart
        return None


class NvmlSource:
    """The run's GPUs through NVML. Raises `pynvml.NVMLError` where there is no driver or no such GPU."""

    def __init__(self, devices: list[str]) -> None:
        import pynvml

        self.nvml = pynvml
        pynvml.nvmlInit()
        if not devices:
            devices = [str(i) for i in range(pynvml.nvmlDeviceGetCount())]
        # NVML numbers GPUs in PCI bus order, CUDA fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID: indices agree on
        # machines of one GPU model (every machine Ray hands GPUs on here); a UUID names the same GPU in both.
        self.handles = [
            pynvml.nvmlDeviceGetHandleByUUID(d)
            if d.startswith(("GPU-", "MIG-"))
            else pynvml.nvmlDeviceGetHandleByIndex(int(d))
            for d in devices
        ]
        self.devices = devices

    def read(self) -> list[GpuReading]:
        readings = []
        for device, handle in zip(self.devices, self.handles, strict=True):
            rates = self.nvml.nvmlDeviceGetUtilizationRates(handle)
            memory = self.nvml.nvmlDeviceGetMemoryInfo(handle)
            readings.append(
                GpuReading(device=device, utilization_gpu=rates.gpu, memory_used=memory.used, memory_total=memory.total)
            )
        return readings


class ReplaySource:
    """Readings recorded on a real GPU, one JSON list of `GpuReading`s per line, replayed one line per sample."""

    def __init__(self, path: Path) -> None:
        lines = [line for line in Path(path).read_text().splitlines() if line.strip()]
        self.samples = [[GpuReading.model_validate(r) for r in json.loads(line)] for line in lines]
        if not self.samples:
            raise ValueError(f"{path}: no recorded GPU readings")
        self.devices = [r.device for r in self.samples[0]]
        self.cursor = 0

    def read(self) -> list[GpuReading]:
        sample = self.samples[min(self.cursor, len(self.samples) - 1)]
        self.cursor += 1
        return sample


def open_source(devices: list[str]) -> GpuSource | None:
    """The run's GPUs: a recording when one is named, else NVML; None where NVML has no GPU to give."""
    replay = GPU_REPLAY.read()
    if replay is not None:
        return ReplaySource(replay)
    try:
        return NvmlSource(devices)
    except Exception:  # no pynvml, no driver (NVMLError_LibraryNotFound), no such GPU: the run has no GPU to sample
        return None


def point_of(readings: list[GpuReading], at_seconds: float) -> GpuPoint:
    return GpuPoint(
        at_seconds=round(at_seconds, 3),
        utilization=sum(r.utilization_gpu for r in readings) / (100 * len(readings)),
        memory_used_bytes=sum(r.memory_used for r in readings),
    )


def add_sample(use: GpuUse, readings: list[GpuReading], at_seconds: float) -> GpuUse:
    """`use` with one more sample; the curve keeps at most MAX_POINTS, halved by merging neighbours (mean
    utilisation, the larger memory) so that its peaks survive."""
    point = point_of(readings, at_seconds)
    curve = [*use.curve, point]
    if len(curve) > MAX_POINTS:
        curve = [merge(a, b) for a, b in zip(curve[0::2], curve[1::2], strict=False)] + (
            [curve[-1]] if len(curve) % 2 else []
        )
    return use.model_copy(
        update={
            "samples": use.samples + 1,
            "utilization_sum": use.utilization_sum + point.utilization,
            "peak_memory_bytes": max(use.peak_memory_bytes, point.memory_used_bytes),
            "memory_total_bytes": sum(r.memory_total for r in readings),
            "curve": curve,
        }
    )


def merge(a: GpuPoint, b: GpuPoint) -> GpuPoint:
    return GpuPoint(
        at_seconds=b.at_seconds,
        utilization=(a.utilization + b.utilization) / 2,
        memory_used_bytes=max(a.memory_used_bytes, b.memory_used_bytes),
    )


def read_gpu_use(run_dir: Path) -> GpuUse | None:
    return read_model(Path(run_dir) / GPU_FILE, GpuUse)


class GpuMeter:
    """Samples the run's GPUs every `interval_s` in a daemon thread: the run's series, and `gpu.json`."""

    def __init__(self, run_dir: Path, source: GpuSource, telemetry: Any, interval_s: float) -> None:
        self.path = Path(run_dir) / GPU_FILE
        self.source = source
        self.telemetry = telemetry
        self.interval_s = interval_s
        earlier = read_model(self.path, GpuUse)  # a resumed run goes on from its earlier attempts
        self.use = earlier or GpuUse(devices=source.devices)
        self.offset = earlier.curve[-1].at_seconds if earlier and earlier.curve else 0.0
        self.started = time.monotonic()
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="gpu-meter", daemon=True)

    def sample(self) -> None:
        readings = self.source.read()
        self.use = add_sample(self.use, readings, self.offset + time.monotonic() - self.started)
        self.telemetry.gpus(readings)
        write_model(self.path, self.use)

    def _loop(self) -> None:
        logged: set[str] = set()
        while not self.halt.is_set():
            try:
                self.sample()
            except Exception as exc:  # a GPU that fell off the bus (NVMLError), a full disk: the run goes on
                if type(exc).__name__ not in logged:  # once per kind: it samples every few seconds
                    logged.add(type(exc).__name__)
                    where = self.path.parent
                    log.warning("run %s: GPU sampling failed, last values kept: %s: %s", where, type(exc).__name__, exc)
            self.halt.wait(self.interval_s)

    def start(self) -> GpuMeter:
        self.thread.start()
        return self

    def stop(self) -> GpuUse:
        self.halt.set()
        self.thread.join(timeout=5)
        return self.use


def start_gpu_meter(run_dir: Path, gpus: int, telemetry: Any) -> GpuMeter | None:
    """The run's GPU meter, or None for a run with no GPU to sample (its series stay absent)."""
    devices = run_devices(os.environ.get("CUDA_VISIBLE_DEVICES"), gpus)
    if devices is None:
        return None
    source = open_source(devices)
    if source is None:
        return None
    interval = GPU_SAMPLE_S.read()
    return GpuMeter(run_dir, source, telemetry, interval).start()
