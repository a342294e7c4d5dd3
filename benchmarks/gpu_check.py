"""On a machine with an NVIDIA GPU: a run's processes, and the GPU memory they hold, end with the run.

Two runs of a tiny task on GPU 0 through the local sandbox (`supervise_run`), each agent starting a process that
holds GPU memory in ways no process group reaches (`setsid nohup python3 ... &` with PyTorch, and an async job
that detaches another), as issue #23 measured them surviving:

1. the run ends on its wall budget;
2. the harness and the agent are killed with SIGKILL mid-run (the holders live on: printed), then the run resumes;
3. a run whose agent trains a small PyTorch model for about 25 s (idle, ~3 GiB, then ~7 GiB held): the run's
   `result.json` `gpu` (mean utilisation, peak memory) from labkube's own meter must agree with NVML read
   independently beside it.

Prints the GPU's free memory (NVML) before, while the holders run, and after each; the holders' pids after; and
the run's GPU figures as `result.json` has them (the real NVML path of agent/harness/gpu.py). Exit 1 when a holder
outlives its run or the memory does not come back, or the training run's figures disagree with NVML. With
`--record FILE`, also writes the NVML readings taken every 0.5 s during the training run in the format
`LABKUBE_GPU_REPLAY` replays (tests/data/nvml/one-gpu-training.jsonl is such a recording).

    bash benchmarks/gpu_check.sh [--record FILE] [--gib 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from tinytask import make_run_dir, make_tiny_task

from labkube.agent.containment import alive
from labkube.agent.harness.gpu import NvmlSource
from labkube.budgets import Budgets
from labkube.operator.supervisor import supervise_run
from labkube.result import GpuUse

MIB = 2**20
HOLD = (
    "import os, sys, time, torch; x = torch.empty(int(float(sys.argv[1]) * 2**30), dtype=torch.uint8, device='cuda'); "
    "x.fill_(1); torch.cuda.synchronize(); open(sys.argv[2], 'w').write(str(os.getpid())); time.sleep(600)"
)


def plan(gib: float) -> list[dict]:
    hold = f'python3 -c "{HOLD}"'
    return [
        {"tool": "bash", "args": {"command": f"setsid nohup {hold} {gib} setsid.pid >holder.log 2>&1 & sleep 1"}},
        {
            "tool": "start_async",
            "args": {"command": f"setsid {hold} {gib} job.pid >job-holder.log 2>&1 & sleep 600"},
        },
        {"tool": "bash", "args": {"command": "until [ -s setsid.pid ] && [ -s job.pid ]; do sleep 0.2; done"}},
        *[{"tool": "bash", "args": {"command": "sleep 1"}}] * 600,
    ]


def free_mib(gpu: NvmlSource) -> int:
    reading = gpu.read()[0]
    return (reading.memory_total - reading.memory_used) // MIB


def holders(workspace: Path, timeout: float = 120) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return {name: int((workspace / name).read_text()) for name in ("setsid.pid", "job.pid")}
        except (OSError, ValueError):
            time.sleep(0.2)
    logs = {p.name: p.read_text()[-400:] for p in workspace.glob("*holder.log")}
    raise SystemExit(f"the holders never started: {logs}")


def wait_freed(gpu: NvmlSource, before: int, timeout: float = 20) -> int:
    """Free memory once it is back within 256 MiB of `before` (the driver frees a context a moment after exit)."""
    deadline = time.monotonic() + timeout
    now = free_mib(gpu)
    while now < before - 256 and time.monotonic() < deadline:
        time.sleep(0.2)
        now = free_mib(gpu)
    return now


def record(gpu: NvmlSource, out: Path, halt: threading.Event) -> None:
    with out.open("w") as fh:
        while not halt.is_set():
            fh.write(json.dumps([r.model_dump() for r in gpu.read()]) + "\n")
            halt.wait(0.5)


def budget_case(root: Path, gpu: NvmlSource, gib: float) -> bool:
    task = make_tiny_task(root, plan(gib), resources={"gpus": 1})
    run_dir = make_run_dir(root, task, budgets=Budgets(wall_hours=25 / 3600), gpus=1)
    before = free_mib(gpu)

    async def run() -> tuple[dict[str, int], int, object]:
        supervising = asyncio.create_task(supervise_run(str(run_dir)))
        pids = await asyncio.to_thread(holders, run_dir / "workspace")
        await asyncio.sleep(2)
        during = free_mib(gpu)
        return pids, during, await supervising

    pids, during, result = asyncio.run(run())
    after = wait_freed(gpu, before)
    left = {k: p for k, p in pids.items() if alive(p)}
    gpu_use = json.loads((run_dir / "result.json").read_text()).get("gpu")
    print(
        f"[budget] stop: {result.stop_reason}; GPU free MiB before {before}, with the holders {during}, after {after}"
    )
    print(f"[budget] holder pids {pids}; alive after the run: {left or 'none'}")
    print(f"[budget] result.json gpu: {json.dumps({k: v for k, v in (gpu_use or {}).items() if k != 'curve'})}")
    return not left and after >= before - 256 and during < before - 256 * gib


def kill9_case(root: Path, gpu: NvmlSource, gib: float) -> bool:
    task = make_tiny_task(root, plan(gib), resources={"gpus": 1})
    run_dir = make_run_dir(root, task, budgets=Budgets(wall_hours=30 / 3600), gpus=1)
    before = free_mib(gpu)
    harness = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import asyncio,sys; from labkube.operator.supervisor import supervise_run; "
            "asyncio.run(supervise_run(sys.argv[1]))",
            str(run_dir),
        ],
        start_new_session=True,
    )
    pids = holders(run_dir / "workspace")
    agents = [
        int(c)
        for t in os.listdir(f"/proc/{harness.pid}/task")
        for c in Path(f"/proc/{harness.pid}/task/{t}/children").read_text().split()
    ]
    for agent in agents:
        os.kill(agent, signal.SIGSTOP)
    os.killpg(harness.pid, signal.SIGKILL)
    for agent in agents:
        os.kill(agent, signal.SIGKILL)
    harness.wait()
    time.sleep(1)
    orphaned = free_mib(gpu)
    survivors = {k: p for k, p in pids.items() if alive(p)}
    print(
        f"[kill -9] harness and agent killed; GPU free MiB before {before}, with the orphans {orphaned}; "
        f"holders alive: {survivors or 'none'}"
    )
    result = asyncio.run(supervise_run(str(run_dir)))
    after = wait_freed(gpu, before)
    left = {k: p for k, p in pids.items() if alive(p)}
    print(
        f"[kill -9] resumed run ended ({result.stop_reason}, resumes {result.resumes}); GPU free MiB after {after}; "
        f"holders alive: {left or 'none'}"
    )
    return not left and after >= before - 256


TRAIN = """
import time, torch
torch.manual_seed(0)
time.sleep(3)  # the run's first seconds: the GPU idle
def phase(width, batch, seconds):
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x, y = torch.randn(batch, width, device="cuda"), torch.randn(batch, width, device="cuda")
    end, steps = time.time() + seconds, 0
    while time.time() < end:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps += 1
        torch.cuda.synchronize()
    print(f"width {width} batch {batch}: {steps} steps, loss {loss.item():.4f}, "
          f"peak allocated {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB", flush=True)
    return model, x, y
first = phase(4096, 32768, 10)
second = phase(4096, 65536, 10)
del first, second
torch.cuda.empty_cache()
time.sleep(2)  # the last seconds: memory given back, the GPU idle
"""


def training_case(root: Path, gpu: NvmlSource, record_to: Path | None) -> bool:
    steps = [{"tool": "bash", "args": {"command": f"cat > train.py <<'EOF'{TRAIN}EOF\npython3 train.py 2>&1"}}]
    task = make_tiny_task(root, steps, resources={"gpus": 1})
    run_dir = make_run_dir(root, task, budgets=Budgets(wall_hours=180 / 3600), gpus=1)
    out = record_to or root / "nvml.jsonl"
    halt = threading.Event()
    recorder = threading.Thread(target=record, args=(gpu, out, halt))
    recorder.start()
    try:
        result = asyncio.run(supervise_run(str(run_dir)))
    finally:
        halt.set()
        recorder.join()
    readings = [json.loads(line)[0] for line in out.read_text().splitlines() if line.strip()]
    nvml_peak = max(r["memory_used"] for r in readings)
    nvml_mean = sum(r["utilization_gpu"] for r in readings) / 100 / len(readings)
    busy = [r["utilization_gpu"] for r in readings if r["memory_used"] > 2 * 2**30]
    use = json.loads((run_dir / "result.json").read_text()).get("gpu") or {}
    mean = GpuUse.model_validate(use).mean_utilization if use else None
    print(f"[training] stop: {result.stop_reason}")
    print(
        f"[training] NVML beside the run: {len(readings)} readings, mean utilisation {nvml_mean:.0%}, "
        f"while training {sum(busy) / max(1, len(busy)):.0f} %, peak {nvml_peak / MIB:.0f} MiB"
    )
    print(f"[training] result.json gpu: {json.dumps({k: v for k, v in use.items() if k != 'curve'})}; mean {mean}")
    peak = use.get("peak_memory_bytes") or 0
    ok = (
        bool(busy)
        and sum(busy) / len(busy) >= 50
        and nvml_peak > 5 * 2**30
        and abs(peak - nvml_peak) <= 512 * MIB  # sampled at different instants: the peak is a plateau
        and mean is not None
        and abs(mean - nvml_mean) <= 0.25
    )
    print(f"[training] {'agrees' if ok else 'DISAGREES'} with NVML")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", type=Path, help="write the training run's NVML readings here (JSON lines)")
    parser.add_argument("--gib", type=float, default=3.0, help="GPU memory each holder takes (GiB)")
    args = parser.parse_args()
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "0")
    os.environ.setdefault("LABKUBE_GPU_SAMPLE_S", "1")
    gpu = NvmlSource([os.environ["CUDA_VISIBLE_DEVICES"].split(",")[0]])
    print(
        f"GPU {gpu.devices[0]}: {gpu.read()[0].memory_total // MIB} MiB; containment: "
        f"{os.environ.get('LABKUBE_CONTAINMENT', 'auto')}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        ok = budget_case(Path(tmp) / "budget", gpu, args.gib)
        ok = kill9_case(Path(tmp) / "kill9", gpu, args.gib) and ok
        ok = training_case(Path(tmp) / "training", gpu, args.record) and ok
        for run in Path(tmp).glob("*/runs/*/containment.json"):
            print(f"{run.parent.name}: {run.read_text().strip()}")
    agreed = "OK: every holder ended with its run, its GPU memory came back, the run's GPU figures agree"
    print(agreed if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
