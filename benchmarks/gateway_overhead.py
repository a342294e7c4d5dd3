"""The model gateway's added latency: the same calls through a run's gateway and straight to the same provider.

Three processes, as in a run: the provider (tests/fakellm.py, answering at once and sending a streamed answer's
events `--event-interval-ms` apart, as a model produces tokens), the run's gateways (agent/gateway/, one per API
family, with the transcript, gateway.json and Prometheus series a run has), and the client: the real `openai` and
`anthropic` SDKs (async clients, no retries) calling the OpenAI Responses API (what Codex speaks) and Anthropic
Messages (what Claude Code speaks), streamed and not, with a request the size of a coding agent's (`--request-kb`
of conversation and tool definitions).

Direct and gateway calls alternate so that the machine's load falls on both alike: at concurrency 1 each pair is
one call each way, in random order; at concurrency C each pair is a round of C simultaneous calls each way, in random
order, and call k of the gateway's round is paired with call k of the direct round. Warm-up pairs (connections
opened, code paths warm) are not counted. The added latency at a percentile is that percentile of the paired
differences (gateway minus direct, pair by pair), never a difference of two samples' percentiles. A third client,
`control`, calls the provider directly too, in the same alternation: its paired differences with the direct calls
are the noise floor (what a gateway that added nothing would show), so a p95 added can be read against it, and a
negative tail is noise, not a gain. `--baseline REF` adds another way, the gateway as it was at commit REF (its
agent/gateway.py, or agent/gateway/ since the split, in a process of its own), to the same alternation: a before and
after measured under the same load. The gateway runs on asyncio's loop, as `labkube agent` runs it beside a
local run's CLI; `--loop uvloop` runs it on uvloop, as a pod's gateway sidecar does, and `--baseline-loop` sets the
baseline's, so `--loop uvloop --baseline HEAD` measures the loop alone. `--nginx` adds nginx as a bare reverse
proxy (C, one process, streaming unbuffered, no accounting) to the same alternation: what any proxy hop adds on this
machine, the floor under the gateway's figures (Debian: `apt-get install nginx-light`). `--pause-ms` pauses
after each side's call or round, as an agent's own work separates its calls: without it, what a gateway does after
its answers (the transcript, the state file) runs into the next side's round and is charged to that side. A
streamed call's latency is to its last event; its first token is its first text delta as the SDK yields it.
`--gateway-cpus 1` gives the gateways CPU 1 alone and the client and provider the others, as a pod's gateway sidecar
has a CPU of its own beside the agent's container; by default all three share every CPU, as a local run's gateway
shares the machine with its CLI. The client's heap is kept out of the garbage collector's full passes (`settle_heap`).

    python benchmarks/gateway_overhead.py [--calls 400] [--rounds 100] [--concurrency 1,4,16] [--baseline REF]
                                          [--pause-ms MS] [--loop asyncio] [--baseline-loop asyncio]
                                          [--gateway-cpus CPUS] [--nginx] [--profile-gateway FILE] [--write-docs]

`--write-docs` replaces the table in docs/third-party-agents.md (`<!-- benchmark:gateway_overhead -->`, or
`<!-- benchmark:gateway_overhead_own_cpu -->` with `--gateway-cpus`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from docs_block import REPO, markdown_table, write_block
from raynodes import free_port

Api = Literal["responses", "messages"]
Side = Literal["direct", "control", "gateway", "baseline", "nginx"]
APIS: tuple[Api, ...] = ("responses", "messages")
MODELS: dict[Api, str] = {"responses": "gpt-5", "messages": "claude-sonnet-4-6"}
ANSWER = "The file result.txt now holds the answer, and the tests pass. " * 3
UPSTREAM_KEY = "sk-benchmark-provider-key"
TARGET_ADDED_P95_MS = 5.0
TARGET_FIRST_TOKEN_MS = 2.0
LOOPS = ("uvloop", "asyncio")
MODEL_MS_FIELD = "benchmark_model_ms"


# -- the provider and the gateways, each in a process of its own


def serve_upstream(event_interval_s: float) -> None:
    """tests/fakellm.py with a pause after each streamed event; prints its URL, serves until stdin closes."""
    import fakellm

    class PacedHandler(fakellm._Handler):
        # A provider sends its headers and body without waiting on the client's delayed ACK (40 ms on Linux).
        disable_nagle_algorithm = True

        def _chunk(self, payload: bytes) -> None:
            super()._chunk(payload)
            if payload and event_interval_s:
                time.sleep(event_interval_s)

    class ListeningServer(fakellm.LocalHTTPServer):
        request_queue_size = 128  # socketserver's 5 drops connections when 16 clients connect at once

    class PacedFakeLLM(fakellm.FakeLLM):
        def __enter__(self) -> PacedFakeLLM:
            # The fake keeps every request it saw; a benchmark's tens of thousands of large bodies would pile up.
            self._requests = deque(maxlen=16)  # type: ignore[assignment]
            self._httpd = ListeningServer(self, PacedHandler)
            self.thread = fakellm.threading.Thread(target=self._httpd.serve_forever, name="fakellm", daemon=True)
            self.thread.start()
            return self

    usage = fakellm.Usage(input=20_000, output=120, reasoning=40, cached=16_000)
    answer = fakellm.Reply.text(ANSWER, usage=usage)

    def model_time(path: str, request: dict[str, Any]) -> Any:
        # The in-flight cases ask for a model's time before its answer (a field of the request's bulk, which the
        # gateway forwards as it came); a real provider would refuse the field, this one only reads it.
        wait_ms = request.get(MODEL_MS_FIELD)
        return fakellm.Reply.delay(wait_ms / 1e3, then=answer) if isinstance(wait_ms, int | float) else None

    with PacedFakeLLM(default=answer, responder=model_time) as server:
        settle_heap()
        print(server.base_url, flush=True)
        sys.stdin.read()


BASELINE_MODULE = "labkube_gateway_baseline"


def gateway_module(source: Path | None) -> Any:
    """labkube's gateway, or the one in `source`, an earlier commit's (agent/gateway.py, or the agent/gateway/
    package since it was split), importing today's labkube."""
    if source is None:
        from labkube.agent import gateway

        return gateway
    import importlib.util

    if source.is_dir():  # the package: its modules import each other under the baseline's name
        spec = importlib.util.spec_from_file_location(
            BASELINE_MODULE, source / "__init__.py", submodule_search_locations=[str(source)]
        )
    else:
        spec = importlib.util.spec_from_file_location(BASELINE_MODULE, source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # pydantic resolves the models' annotations from it
    spec.loader.exec_module(module)
    return module


async def serve_gateways(upstream_url: str, run_dir: Path, source: Path | None) -> None:
    """One run's gateway per API family, metering as a run's does; prints their addresses and tokens as JSON, serves
    until stdin closes."""
    from labkube.agent.telemetry import RunTelemetry
    from labkube.agent.transcript import JsonlLog
    from labkube.run_spec import RunSpec

    bases = {"openai": upstream_url + "/v1", "anthropic": upstream_url}
    gateways = []
    for family, base in bases.items():
        spec = RunSpec(
            run_id=f"bench--{family}--s0",
            campaign="bench",
            task="t",
            task_path=str(run_dir),
            model=f"{family}:m",
            seed=0,
        )
        gw = gateway_module(source)
        config = gw.GatewayConfig(**{family: gw.Upstream(base_url=base, api_key=UPSTREAM_KEY)}, provider_prefix=family)
        gateway = gw.ModelGateway(
            config,
            transcript=JsonlLog(run_dir / family / "transcript.jsonl"),
            telemetry=RunTelemetry(spec),
            state_path=run_dir / family / "gateway.json",
        )
        gateways.append(await gateway.start())
    openai_gw, anthropic_gw = gateways
    address = {
        "pid": os.getpid(),
        "responses": {"base_url": openai_gw.openai_base_url, "token": openai_gw.config.token},
        "messages": {"base_url": anthropic_gw.anthropic_base_url, "token": anthropic_gw.config.token},
    }
    print(json.dumps(address), flush=True)
    await asyncio.to_thread(sys.stdin.read)
    for gateway in gateways:
        await gateway.close()


NGINX_CONF = """daemon off; master_process off; worker_processes 1;
pid {dir}/nginx.pid; error_log {dir}/error.log;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  client_body_temp_path {dir}/body; proxy_temp_path {dir}/proxy; fastcgi_temp_path {dir}/fastcgi;
  uwsgi_temp_path {dir}/uwsgi; scgi_temp_path {dir}/scgi;
  client_max_body_size 0; client_body_buffer_size 1m;
  upstream provider {{ server {upstream}; keepalive 64; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://provider; proxy_http_version 1.1; proxy_set_header Connection "";
      proxy_buffering off; proxy_read_timeout 600s;
    }}
  }}
}}
"""


@contextlib.contextmanager
def nginx_relay(upstream_url: str, run_dir: Path) -> Any:
    """nginx as a bare reverse proxy to the provider: one process (its CPU is the process's), keep-alive both ways,
    answers relayed as they come (`proxy_buffering off`), nothing counted. Yields its address as a gateway's."""
    run_dir.mkdir(parents=True)
    port = free_port()
    conf = run_dir / "nginx.conf"
    conf.write_text(NGINX_CONF.format(dir=run_dir, upstream=upstream_url.split("//", 1)[1], port=port))
    proc = subprocess.Popen(["nginx", "-p", str(run_dir), "-e", str(run_dir / "error.log"), "-c", str(conf)])
    try:
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                log = run_dir / "error.log"
                said = log.read_text().strip().splitlines() if log.exists() else []
                raise SystemExit(f"--nginx: nginx did not listen ({said[-1] if said else f'exit code {proc.poll()}'})")
            time.sleep(0.02)
        base = f"http://127.0.0.1:{port}"
        yield {
            "pid": proc.pid,
            "responses": {"base_url": base + "/v1", "token": UPSTREAM_KEY},
            "messages": {"base_url": base, "token": UPSTREAM_KEY},
        }
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def server_process(*args: str) -> Any:
    """This script in another mode, as a child process; yields its first line of output and stops it on exit."""
    proc = subprocess.Popen(
        [sys.executable, __file__, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            raise SystemExit(f"benchmark server {' '.join(args)} exited before it listened (code {proc.wait()})")
        yield line.strip()
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- the client


def agent_request(api: Api, request_kb: int) -> dict[str, Any]:
    """A coding agent's call: a system prompt, a dozen tools and a conversation of tool calls and results, about
    `request_kb` of JSON in all."""
    system = "You are a coding agent working in a repository. Follow the instructions. " * 40
    tools = [
        {
            "name": f"tool_{i}",
            "description": f"Tool number {i}: runs one kind of action in the workspace and returns its output. " * 3,
            "schema": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "what to run"}},
                "required": ["command"],
            },
        }
        for i in range(12)
    ]
    output = "line of command output, as a tool returns it\n" * 20
    turns: list[dict[str, Any]] = []
    size = len(system) + len(json.dumps(tools))
    i = 0
    while size < request_kb * 1024:
        if api == "responses":
            call = {"type": "function_call", "call_id": f"call_{i}", "name": "tool_0", "arguments": '{"command":"ls"}'}
            turns += [call, {"type": "function_call_output", "call_id": f"call_{i}", "output": output}]
        else:
            use = {"type": "tool_use", "id": f"toolu_{i}", "name": "tool_0", "input": {"command": "ls"}}
            result = {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": output}
            turns += [{"role": "assistant", "content": [use]}, {"role": "user", "content": [result]}]
        size += len(json.dumps(turns[-2:]))
        i += 1
    if api == "responses":
        return {
            "instructions": system,
            "tools": [
                {"type": "function", "name": t["name"], "description": t["description"], "parameters": t["schema"]}
                for t in tools
            ],
            "input": [{"role": "user", "content": "Fix the failing test."}, *turns],
        }
    return {
        "system": system,
        "tools": [{"name": t["name"], "description": t["description"], "input_schema": t["schema"]} for t in tools],
        "messages": [{"role": "user", "content": "Fix the failing test."}, *turns],
    }


@dataclass
class Sample:
    total_s: float
    first_token_s: float | None


@dataclass
class Case:
    api: Api
    stream: bool
    concurrency: int
    in_flight: bool = False  # callers each in a loop of calls that take a model's time, not rounds at once
    samples: dict[Side, list[Sample]] = field(default_factory=dict)
    cpu_ms_per_call: dict[Side, float | None] = field(default_factory=dict)  # each gateway process's, warm-up included


def cpu_seconds(pid: int) -> float | None:
    """The user and system CPU time a process has used so far (None where /proc is not there to say)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def one_call(client: Any, api: Api, stream: bool, bulk: dict[str, Any]) -> Sample:
    """One call; the request's bulk goes as the SDK's `extra_body`, so that the SDK's typed transform of its
    arguments (some 60 ms of CPU for a 64 KB Responses input, which neither CLI has) does not drown the figures."""
    started = time.perf_counter()
    first = None
    if api == "responses":
        kwargs: dict[str, Any] = {"model": MODELS[api], "input": "", "extra_body": bulk}
        if not stream:
            text = (await client.responses.create(**kwargs)).output_text
        else:
            parts = []
            async for event in await client.responses.create(**kwargs, stream=True):
                if event.type == "response.output_text.delta":
                    first = first or time.perf_counter()
                    parts.append(event.delta)
            text = "".join(parts)
    else:
        kwargs = {"model": MODELS[api], "max_tokens": 4096, "messages": [], "extra_body": bulk}
        if not stream:
            text = "".join(b.text for b in (await client.messages.create(**kwargs)).content if b.type == "text")
        else:
            parts = []
            async for event in await client.messages.create(**kwargs, stream=True):
                if event.type == "content_block_delta" and event.delta.type == "text_delta":
                    first = first or time.perf_counter()
                    parts.append(event.delta.text)
            text = "".join(parts)
    ended = time.perf_counter()
    if text != ANSWER:
        raise SystemExit(f"{api}: the answer came back wrong: {text[:80]!r}")
    return Sample(ended - started, None if first is None else first - started)


def clients(upstream_url: str, gateways: dict[Side, dict[str, Any]]) -> dict[tuple[Side, Api], Any]:
    """The SDKs' async clients, each with its own connection pool (their default limits are far above 16): two straight
    to the provider (`direct`, and `control` for the noise floor) and one to each gateway."""
    import anthropic
    import openai

    made: dict[tuple[Side, Api], Any] = {}
    for side in ("direct", "control"):
        made[(side, "responses")] = openai.AsyncOpenAI(
            api_key=UPSTREAM_KEY, base_url=upstream_url + "/v1", max_retries=0
        )
        made[(side, "messages")] = anthropic.AsyncAnthropic(api_key=UPSTREAM_KEY, base_url=upstream_url, max_retries=0)
    for side, address in gateways.items():
        gw_openai, gw_anthropic = address["responses"], address["messages"]  # type: ignore[index]
        made[(side, "responses")] = openai.AsyncOpenAI(
            api_key=gw_openai["token"], base_url=gw_openai["base_url"], max_retries=0
        )
        made[(side, "messages")] = anthropic.AsyncAnthropic(
            api_key=gw_anthropic["token"], base_url=gw_anthropic["base_url"], max_retries=0
        )
    return made


def settle_heap() -> None:
    """Keep the objects alive now (the SDKs' modules, models and clients, hundreds of thousands) out of the garbage
    collector's full passes. Otherwise one takes 150-220 ms of the client's loop, twice a case at 16 at once, and stalls
    whichever calls are in flight, on every side alike: noise from the harness (neither CLI is a Python process)."""
    gc.collect()
    gc.freeze()


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of process `pid` on `cpus` (threads it starts later inherit it)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(task.name), cpus)


def charge_cpu(case: Case, pids: dict[Side, int], before: dict[Side, float | None], calls: int) -> None:
    """Each gateway process's CPU since `before`, per call of the case (unknown where /proc did not say)."""
    for side, then in before.items():
        now = cpu_seconds(pids[side])
        case.cpu_ms_per_call[side] = None if then is None or now is None else (now - then) * 1e3 / calls


async def measure(
    case: Case,
    made: dict[tuple[Side, Api], Any],
    sides: list[Side],
    pids: dict[Side, int],
    request: dict[str, Any],
    pairs: int,
    warmup: int,
    seed: int,
    pause_s: float = 0.0,
) -> None:
    """`pairs` counted pairs (after `warmup` uncounted ones) of a call each way (concurrency 1) or a round of
    simultaneous calls each way, in an order drawn at random each time, `pause_s` after each round: a gateway's work
    after its answers (the transcript, the state file) then falls in its own time, not in the next side's round."""
    rng = random.Random(seed)
    case.samples = {side: [] for side in sides}
    cpu_before = {side: cpu_seconds(pids[side]) for side in pids}
    for i in range(warmup + pairs):
        order = list(sides)
        rng.shuffle(order)
        for side in order:
            client = made[(side, case.api)]
            calls = [one_call(client, case.api, case.stream, request) for _ in range(case.concurrency)]
            try:
                samples = await asyncio.gather(*calls)
            except Exception as exc:
                where = f"{side} call, {API_NAMES[case.api]}, stream={case.stream}"
                raise SystemExit(f"{where}: {exc!r} ({exc.__cause__!r})") from exc
            if i >= warmup:
                case.samples[side].extend(samples)
            if pause_s:
                await asyncio.sleep(pause_s)
    charge_cpu(case, pids, cpu_before, (warmup + pairs) * case.concurrency)


async def measure_in_flight(
    case: Case,
    made: dict[tuple[Side, Api], Any],
    sides: list[Side],
    pids: dict[Side, int],
    request: dict[str, Any],
    pairs: int,
    warmup: int,
    seed: int,
    model_ms: float,
    think_ms: float,
) -> None:
    """`case.concurrency` callers at once, as agents (or one agent's subagents) are: each starts at a random moment
    within one model call's time, then makes `warmup` + `pairs` pairs of calls, one each way in random order, each
    call taking the provider `model_ms` before its answer and followed by a pause drawn from 0 to 2 x `think_ms` (the
    agent's own work). Calls are in flight together, but arrive spread out, as real agents' do, not in one burst.
    Pair i of caller j is that caller's i-th call each way."""
    bulk = {**request, MODEL_MS_FIELD: model_ms}
    per_caller: list[dict[Side, list[Sample]]] = [{side: [] for side in sides} for _ in range(case.concurrency)]
    cpu_before = {side: cpu_seconds(pids[side]) for side in pids}

    async def caller(j: int) -> None:
        rng = random.Random(seed * 1000 + j)
        await asyncio.sleep(rng.uniform(0, model_ms / 1e3))
        for i in range(warmup + pairs):
            order = list(sides)
            rng.shuffle(order)
            for side in order:
                try:
                    sample = await one_call(made[(side, case.api)], case.api, case.stream, bulk)
                except Exception as exc:
                    where = f"{side} call in flight, {API_NAMES[case.api]}, stream={case.stream}"
                    raise SystemExit(f"{where}: {exc!r} ({exc.__cause__!r})") from exc
                if i >= warmup:
                    per_caller[j][side].append(sample)
                await asyncio.sleep(rng.uniform(0, 2 * think_ms / 1e3))

    await asyncio.gather(*(caller(j) for j in range(case.concurrency)))
    case.samples = {side: [s for samples in per_caller for s in samples[side]] for side in sides}
    charge_cpu(case, pids, cpu_before, (warmup + pairs) * case.concurrency)


# -- figures


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default)."""
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    low = int(k)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (k - low)


PERCENTILES = (50, 95, 99)
FIRST_TOKEN_PERCENTILES = (50, 95)


def paired_differences(case: Case, side: Side, first_token: bool = False) -> list[float]:
    """`side`'s calls minus the direct calls they were paired with, in ms (of the first token: the pairs where both
    calls streamed a text delta)."""
    out = []
    for made, direct in zip(case.samples[side], case.samples["direct"], strict=True):
        if not first_token:
            out.append((made.total_s - direct.total_s) * 1e3)
        elif made.first_token_s is not None and direct.first_token_s is not None:
            out.append((made.first_token_s - direct.first_token_s) * 1e3)
    return out


def percentiles(values: Sequence[float], qs: Sequence[int]) -> dict[int, float]:
    """{} where there are no values: unknown, not zero."""
    return {q: percentile(values, q) for q in qs} if values else {}


@dataclass
class Figures:
    """A case in ms: the direct calls' own percentiles, the paired differences of one side (added) and of the
    control's direct calls (noise), and each side's own percentiles (what a user sees: `shift` = the side's own pN
    minus the direct calls' own pN)."""

    direct_ms: dict[int, float]
    added_ms: dict[int, float]
    noise_ms: dict[int, float]
    own_ms: dict[int, float] = field(default_factory=dict)
    control_ms: dict[int, float] = field(default_factory=dict)
    first_direct_ms: dict[int, float] = field(default_factory=dict)
    first_added_ms: dict[int, float] = field(default_factory=dict)
    first_noise_ms: dict[int, float] = field(default_factory=dict)
    first_own_ms: dict[int, float] = field(default_factory=dict)
    first_control_ms: dict[int, float] = field(default_factory=dict)

    def shift(self, q: int, first_token: bool = False, noise: bool = False) -> float | None:
        """The side's (or, with `noise`, the control's) own pN minus the direct calls' own pN; None where either is
        unknown."""
        direct = self.first_direct_ms if first_token else self.direct_ms
        if first_token:
            other = self.first_control_ms if noise else self.first_own_ms
        else:
            other = self.control_ms if noise else self.own_ms
        return other[q] - direct[q] if q in other and q in direct else None


def totals_ms(samples: Sequence[Sample]) -> list[float]:
    return [s.total_s * 1e3 for s in samples]


def first_tokens_ms(samples: Sequence[Sample]) -> list[float]:
    return [s.first_token_s * 1e3 for s in samples if s.first_token_s is not None]


def figures(case: Case, side: Side = "gateway") -> Figures:
    out = Figures(
        direct_ms=percentiles(totals_ms(case.samples["direct"]), PERCENTILES),
        added_ms=percentiles(paired_differences(case, side), PERCENTILES),
        noise_ms=percentiles(paired_differences(case, "control"), PERCENTILES),
        own_ms=percentiles(totals_ms(case.samples[side]), PERCENTILES),
        control_ms=percentiles(totals_ms(case.samples["control"]), PERCENTILES),
    )
    if case.stream:
        out.first_direct_ms = percentiles(first_tokens_ms(case.samples["direct"]), FIRST_TOKEN_PERCENTILES)
        out.first_added_ms = percentiles(paired_differences(case, side, True), FIRST_TOKEN_PERCENTILES)
        out.first_noise_ms = percentiles(paired_differences(case, "control", True), FIRST_TOKEN_PERCENTILES)
        out.first_own_ms = percentiles(first_tokens_ms(case.samples[side]), FIRST_TOKEN_PERCENTILES)
        out.first_control_ms = percentiles(first_tokens_ms(case.samples["control"]), FIRST_TOKEN_PERCENTILES)
    return out


HEADER = (
    "API",
    "streamed",
    "calls",
    "pairs",
    "direct p50",
    "direct p95",
    "added p50",
    "added p95",
    "added p99",
    "noise p95",
    "1st token direct p50",
    "1st token added p50",
    "1st token added p95",
    "1st token noise p95",
    "gateway CPU per call",
)
SHIFT_HEADER = (
    "API",
    "streamed",
    "calls",
    "direct p50",
    "gateway p50",
    "direct p95",
    "gateway p95",
    "p95 shift",
    "noise p95 shift",
    "direct p99",
    "gateway p99",
    "1st token direct p95",
    "1st token gateway p95",
    "1st token p95 shift",
    "1st token noise p95 shift",
)
COMPARISON_HEADER = (
    "API",
    "streamed",
    "calls",
    "gateway",
    "added p50",
    "added p95",
    "added p99",
    "p95 shift",
    "1st token added p50",
    "1st token added p95",
    "1st token p95 shift",
    "CPU per call",
)
API_NAMES: dict[Api, str] = {"responses": "OpenAI Responses", "messages": "Anthropic Messages"}


def ms(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def calls_label(case: Case) -> str:
    """1 (one call at a time), "16 at once" (rounds of simultaneous calls) or "16 in flight" (callers in a loop)."""
    if case.in_flight:
        return f"{case.concurrency} in flight"
    return "1" if case.concurrency == 1 else f"{case.concurrency} at once"


def row(case: Case, f: Figures) -> tuple[str, ...]:
    return (
        API_NAMES[case.api],
        "yes" if case.stream else "no",
        calls_label(case),
        f"{len(case.samples['direct']):,}",
        ms(f.direct_ms.get(50)),
        ms(f.direct_ms.get(95)),
        ms(f.added_ms.get(50)),
        ms(f.added_ms.get(95)),
        ms(f.added_ms.get(99)),
        ms(f.noise_ms.get(95)),
        ms(f.first_direct_ms.get(50)),
        ms(f.first_added_ms.get(50)),
        ms(f.first_added_ms.get(95)),
        ms(f.first_noise_ms.get(95)),
        cpu(case.cpu_ms_per_call.get("gateway")),
    )


def shift_row(case: Case, f: Figures) -> tuple[str, ...]:
    return (
        API_NAMES[case.api],
        "yes" if case.stream else "no",
        calls_label(case),
        ms(f.direct_ms.get(50)),
        ms(f.own_ms.get(50)),
        ms(f.direct_ms.get(95)),
        ms(f.own_ms.get(95)),
        ms(f.shift(95)),
        ms(f.shift(95, noise=True)),
        ms(f.direct_ms.get(99)),
        ms(f.own_ms.get(99)),
        ms(f.first_direct_ms.get(95)),
        ms(f.first_own_ms.get(95)),
        ms(f.shift(95, first_token=True)),
        ms(f.shift(95, first_token=True, noise=True)),
    )


def cpu(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.2f}"


def comparison_rows(case: Case, labels: dict[Side, str]) -> list[tuple[str, ...]]:
    """The case's added latency, and how far each way moves the p95s, through each of `labels`' ways (the gateway at
    `--baseline`, nginx, today's gateway), measured in the same alternation."""
    out = []
    for side, label in labels.items():
        f = figures(case, side)
        out.append(
            (
                API_NAMES[case.api],
                "yes" if case.stream else "no",
                calls_label(case),
                label,
                ms(f.added_ms.get(50)),
                ms(f.added_ms.get(95)),
                ms(f.added_ms.get(99)),
                ms(f.shift(95)),
                ms(f.first_added_ms.get(50)),
                ms(f.first_added_ms.get(95)),
                ms(f.shift(95, first_token=True)),
                cpu(case.cpu_ms_per_call.get(side)),
            )
        )
    return out


def misses(case: Case, f: Figures, relay: Figures | None = None) -> list[str]:
    """The targets a case misses, each with the noise floor beside it: where that floor is itself above the target,
    this machine could not have shown the target met. With `relay` (nginx's figures, `--nginx`), what a bare proxy
    hop showed beside it: where that too misses, the machine leaves no proxy the target."""
    calls = calls_label(case)
    how = "one at a time" if calls == "1" else calls
    name = f"{API_NAMES[case.api]}, {'streamed' if case.stream else 'not streamed'}, {how}"
    r = relay
    checks = [("p95 added", f.added_ms.get(95), f.noise_ms.get(95), r and r.added_ms.get(95), TARGET_ADDED_P95_MS)]
    checks.append(("p95 shift", f.shift(95), f.shift(95, noise=True), r and r.shift(95), TARGET_ADDED_P95_MS))
    if case.stream:
        for q in FIRST_TOKEN_PERCENTILES:
            added, noise = f.first_added_ms.get(q), f.first_noise_ms.get(q)
            checks.append(
                (f"first token p{q} added", added, noise, r and r.first_added_ms.get(q), TARGET_FIRST_TOKEN_MS)
            )
        shift, noise = f.shift(95, first_token=True), f.shift(95, first_token=True, noise=True)
        checks.append(("first token p95 shift", shift, noise, r and r.shift(95, True), TARGET_FIRST_TOKEN_MS))
    out = []
    for what, value, noise, bare, target in checks:
        if value is None:
            out.append(f"{name}: {what} unknown (no calls to measure it)")
        elif value >= target:
            floor = "" if noise is None else f"; the control's {noise:.2f} ms"
            floor += "" if bare is None else f"; nginx's {bare:.2f} ms"
            out.append(f"{name}: {what} {value:.2f} ms (target under {target:g} ms{floor})")
    return out


def warmup_pairs(warmup_calls: int, concurrency: int) -> int:
    """Uncounted pairs first: `warmup_calls` calls each way, in rounds of `concurrency`."""
    return -(-warmup_calls // concurrency)


async def run_cases(args: argparse.Namespace, upstream_url: str, gateways: dict[Side, dict[str, Any]]) -> list[Case]:
    sides: list[Side] = ["direct", "control", *gateways]
    pids: dict[Side, int] = {side: address["pid"] for side, address in gateways.items()}  # type: ignore[misc]
    cases = []
    for concurrency in args.concurrency:
        made = clients(upstream_url, gateways)
        settle_heap()
        pairs = args.calls if concurrency == 1 else args.rounds
        warmup = warmup_pairs(args.warmup, concurrency)
        for api in args.apis:
            request = agent_request(api, args.request_kb)
            for stream in (False, True):
                case = Case(api, stream, concurrency)
                await measure(
                    case, made, sides, pids, request, pairs, warmup, seed=len(cases), pause_s=args.pause_ms / 1e3
                )
                cases.append(case)
                print(f"  measured {API_NAMES[api]}, stream={stream}, concurrency {concurrency}", file=sys.stderr)
        for client in made.values():
            await client.close()
    for callers in args.in_flight:
        made = clients(upstream_url, gateways)
        settle_heap()
        for api in args.apis:
            request = agent_request(api, args.request_kb)
            for stream in (False, True):
                case = Case(api, stream, callers, in_flight=True)
                await measure_in_flight(
                    case,
                    made,
                    sides,
                    pids,
                    request,
                    args.in_flight_pairs,
                    -(-args.warmup // callers),
                    seed=len(cases),
                    model_ms=args.model_ms,
                    think_ms=args.think_ms,
                )
                cases.append(case)
                print(f"  measured {API_NAMES[api]}, stream={stream}, {callers} in flight", file=sys.stderr)
        for client in made.values():
            await client.close()
    return cases


def baseline_source(ref: str, into: Path) -> tuple[Path, str]:
    """The gateway as it was at commit `ref` (agent/gateway.py, or the agent/gateway/ package with its imports of
    itself renamed to the baseline's module), and the commit's short hash."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout

    try:
        sha = git("rev-parse", "--short=12", f"{ref}^{{commit}}").strip()
        if git("ls-tree", sha, "agent/gateway.py").strip():  # before the gateway was split into a package
            path = into / f"{BASELINE_MODULE}.py"
            path.write_text(git("show", f"{sha}:agent/gateway.py"))
            return path, sha
        files = git("ls-tree", "--name-only", f"{sha}:agent/gateway/").split()
        path = into / BASELINE_MODULE
        path.mkdir(exist_ok=True)
        for name in (f for f in files if f.endswith(".py")):
            text = git("show", f"{sha}:agent/gateway/{name}")
            (path / name).write_text(text.replace("labkube.agent.gateway.", f"{BASELINE_MODULE}."))
    except subprocess.CalledProcessError as exc:
        why = exc.stderr.strip().splitlines()[-1] if exc.stderr.strip() else "git failed"
        raise SystemExit(f"--baseline {ref}: no agent/gateway.py or agent/gateway/ at that commit ({why})") from None
    return path, sha


def table(title: str, header: Sequence[str], rows: list[tuple[str, ...]]) -> Table:
    out = Table(title=title, title_justify="left")
    for col in header:
        out.add_column(col, justify="left" if col in ("API", "streamed", "gateway") else "right")
    for r in rows:
        out.add_row(*r)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=400, help="pairs of calls per case at concurrency 1")
    parser.add_argument("--rounds", type=int, default=100, help="pairs of simultaneous rounds per case above 1")
    parser.add_argument("--concurrency", default="1,4,16", help="calls at a time, in rounds of simultaneous calls")
    parser.add_argument(
        "--in-flight",
        default="16",
        help="callers each in a loop of calls that take --model-ms (comma-separated counts; '' for none)",
    )
    parser.add_argument("--in-flight-pairs", type=int, default=40, help="pairs of calls per caller in flight")
    parser.add_argument("--model-ms", type=float, default=300.0, help="the provider's time before an in-flight answer")
    parser.add_argument("--think-ms", type=float, default=20.0, help="mean pause after each in-flight call")
    parser.add_argument("--apis", default=",".join(APIS))
    parser.add_argument("--warmup", type=int, default=50, help="uncounted calls each way first, per case")
    parser.add_argument(
        "--pause-ms",
        type=float,
        default=0.0,
        help="a pause after each side's call or round, as an agent's own work separates its calls",
    )
    parser.add_argument("--request-kb", type=int, default=64, help="size of each request's JSON")
    parser.add_argument("--event-interval-ms", type=float, default=2.0, help="the provider's pause between events")
    parser.add_argument("--baseline", metavar="REF", help="also measure the gateway as it was at this commit")
    parser.add_argument("--write-docs", action="store_true", help="put the table into docs/third-party-agents.md")
    parser.add_argument("--doc", type=Path, default=REPO / "docs" / "third-party-agents.md", help=argparse.SUPPRESS)
    parser.add_argument("--profile-gateway", type=Path, help="write the gateway process's cProfile stats here")
    parser.add_argument(
        "--loop",
        choices=LOOPS,
        default="asyncio",
        help="the gateway's event loop (asyncio: as `labkube agent` runs it; uvloop: as the gateway sidecar does)",
    )
    parser.add_argument(
        "--baseline-loop",
        choices=LOOPS,
        default="asyncio",
        help="the --baseline gateway's event loop",
    )
    parser.add_argument(
        "--gateway-cpus",
        metavar="CPUS",
        default="",
        help="CPUs for the gateways alone, e.g. 1 (the client and the provider get the others), as a pod's gateway"
        " sidecar has a CPU of its own beside the agent's container; by default all share every CPU",
    )
    parser.add_argument(
        "--nginx",
        action="store_true",
        help="also measure nginx as a bare reverse proxy (no accounting): what any proxy hop adds on this machine",
    )
    parser.add_argument("--serve-upstream", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--serve-gateways", metavar="UPSTREAM_URL", help=argparse.SUPPRESS)
    parser.add_argument("--gateway-source", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_upstream:
        return serve_upstream(args.event_interval_ms / 1e3)
    if args.serve_gateways:
        serve = serve_gateways(args.serve_gateways, args.run_dir, args.gateway_source)
        run = asyncio.run
        if args.loop == "uvloop":
            import uvloop

            run = uvloop.run
        if args.profile_gateway is None:
            return run(serve)
        import cProfile

        with cProfile.Profile(time.process_time) as profile:  # CPU time: wall time counts being preempted
            run(serve)
        return profile.dump_stats(args.profile_gateway)
    try:
        args.concurrency = [int(c) for c in args.concurrency.split(",") if c]
        args.in_flight = [int(c) for c in args.in_flight.split(",") if c]
    except ValueError:
        parser.error("--concurrency and --in-flight take numbers separated by commas, e.g. 1,16")
    args.apis = args.apis.split(",")
    if unknown := set(args.apis) - set(APIS):
        parser.error(f"--apis: unknown {', '.join(sorted(unknown))} (choose from {', '.join(APIS)})")
    if min(args.calls, args.rounds, args.in_flight_pairs, *args.concurrency, *args.in_flight) < 1:
        parser.error("--calls, --rounds, --in-flight-pairs, --concurrency and --in-flight must be at least 1")
    if min(args.warmup, args.pause_ms, args.model_ms, args.think_ms) < 0:
        parser.error("--warmup, --pause-ms, --model-ms and --think-ms must be at least 0")
    if args.nginx and shutil.which("nginx") is None:
        parser.error("--nginx needs nginx on PATH (Debian: apt-get install nginx-light, into /usr/sbin)")
    profiling = ["--profile-gateway", str(args.profile_gateway.resolve())] if args.profile_gateway else []
    usable = os.sched_getaffinity(0)
    try:
        gateway_cpus = {int(c) for c in args.gateway_cpus.split(",") if c}
    except ValueError:
        parser.error("--gateway-cpus takes CPU numbers separated by commas, e.g. 1")
    if gateway_cpus and (not gateway_cpus < usable):
        parser.error(f"--gateway-cpus must leave the client and provider a CPU of {sorted(usable)}")
    if gateway_cpus:
        os.sched_setaffinity(0, usable - gateway_cpus)  # the provider's process inherits it
    load_before = os.getloadavg()
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        source, baseline = baseline_source(args.baseline, tmp) if args.baseline else (None, None)
        upstream_url = stack.enter_context(
            server_process("--serve-upstream", "--event-interval-ms", str(args.event_interval_ms))
        )
        gateways: dict[Side, dict[str, Any]] = {}
        gateways["gateway"] = json.loads(
            stack.enter_context(
                server_process("--serve-gateways", upstream_url, "--run-dir", str(tmp), "--loop", args.loop, *profiling)
            )
        )
        if source is not None:
            baseline_args = ["--gateway-source", str(source), "--run-dir", str(tmp / "baseline")]
            baseline_args += ["--loop", args.baseline_loop]
            gateways["baseline"] = json.loads(
                stack.enter_context(server_process("--serve-gateways", upstream_url, *baseline_args))
            )
        if args.nginx:
            gateways["nginx"] = stack.enter_context(nginx_relay(upstream_url, tmp / "nginx"))
        for address in gateways.values() if gateway_cpus else ():
            pin(address["pid"], gateway_cpus)
        cases = asyncio.run(run_cases(args, upstream_url, gateways))
    os.sched_setaffinity(0, usable)  # the machine as the docs' line describes it
    load_after = os.getloadavg()
    rows, shifts, missed = [], [], []
    for case in cases:
        f = figures(case)
        rows.append(row(case, f))
        shifts.append(shift_row(case, f))
        missed += misses(case, f, figures(case, "nginx") if args.nginx else None)
    command = (
        f"python benchmarks/gateway_overhead.py --calls {args.calls} --rounds {args.rounds}"
        f" --concurrency {','.join(map(str, args.concurrency))} --in-flight {','.join(map(str, args.in_flight))}"
        + (
            f" --in-flight-pairs {args.in_flight_pairs} --model-ms {args.model_ms:g} --think-ms {args.think_ms:g}"
            if args.in_flight
            else ""
        )
        + f" --warmup {args.warmup} --request-kb {args.request_kb}"
        f" --event-interval-ms {args.event_interval_ms:g}"
        + (f" --pause-ms {args.pause_ms:g}" if args.pause_ms else "")
        + (f" --baseline {baseline}" if baseline else "")
        + f" --loop {args.loop}"
        + (f" --baseline-loop {args.baseline_loop}" if baseline else "")
        + (f" --gateway-cpus {args.gateway_cpus}" if gateway_cpus else "")
        + (" --nginx" if args.nginx else "")
    )
    warmups = ", ".join(
        f"{warmup_pairs(args.warmup, c)} {'pairs' if c == 1 else 'rounds'} at {c} at once" for c in args.concurrency
    )
    if args.in_flight:
        warmups += f", {-(-args.warmup // max(args.in_flight))} pairs per caller in flight"
    footer = (
        "Milliseconds. Each gateway call is paired with a direct call made beside it (alternated in random order; at"
        " C at once, call k of a round of C each way; at C in flight, C callers each in a loop of calls that take"
        + (
            f" the provider {args.model_ms:g} ms before its answer, {args.think_ms:g} ms pause on average between,"
            if args.in_flight
            else " a model's time,"
        )
        + " pair i = a caller's i-th call each way); added pN = the Nth percentile of the paired differences (gateway"
        " - direct); noise pN = the same of a second direct client's calls (what a gateway adding nothing would"
        " show: a negative tail is noise); direct pN = the direct calls' own. Second table: each side's own"
        " percentiles, and the shift = the gateway's own pN - the direct calls' own pN (what a user's latency"
        " percentiles move by; noise shift = the second direct client's). Gateway CPU per call = the gateway"
        " process's user and system time over the case's calls, warm-up included."
        f" {args.request_kb} KB requests, streamed events {args.event_interval_ms:g} ms apart;"
        + (f" {args.pause_ms:g} ms pause after each side's call or round;" if args.pause_ms else "")
        + f" warm-up not counted: {warmups}; {time.monotonic() - started:.0f} s in all."
        + (
            f" The gateways on CPU {', '.join(map(str, sorted(gateway_cpus)))} alone, the client and the provider on"
            f" {', '.join(map(str, sorted(usable - gateway_cpus)))}."
            if gateway_cpus
            else ""
        )
        + (
            " Last table: each way measured in the same alternation; nginx is a bare reverse proxy (one process,"
            " keep-alive both ways, answers relayed unbuffered, nothing counted): what any proxy hop adds here."
            if args.nginx
            else ""
        )
    )
    console = Console(width=max(Console().width, 170))
    console.print(table("The model gateway's added latency (ms)", HEADER, rows))
    console.print(table("Each side's own percentiles, and how far the gateway moves them (ms)", SHIFT_HEADER, shifts))
    body = markdown_table(HEADER, rows, [False] * 2 + [True] * (len(HEADER) - 2))
    body += "\n\n" + markdown_table(SHIFT_HEADER, shifts, [False] * 2 + [True] * (len(SHIFT_HEADER) - 2))
    labels: dict[Side, str] = {"baseline": f"at {baseline}"} if baseline else {}
    labels |= {"nginx": "nginx, a bare relay"} if args.nginx else {}
    if labels:
        compared = [r for case in cases for r in comparison_rows(case, labels | {"gateway": "now"})]
        title = f"Before ({baseline}) and after" if baseline else "The gateway beside nginx, a bare relay"
        console.print(table(f"{title}, measured together (ms)", COMPARISON_HEADER, compared))
        body += "\n\n" + markdown_table(COMPARISON_HEADER, compared, [False] * 4 + [True] * 8)
    console.print(
        f"{footer} Load average (1 min) {load_before[0]:.2f} before, {load_after[0]:.2f} after, on"
        f" {os.cpu_count()} CPUs."
    )
    for line in missed:
        console.print(f"[red]missed:[/red] {line}")
    if not missed:
        console.print(
            f"every case within the targets (p95 added under {TARGET_ADDED_P95_MS:g} ms, first token under"
            f" {TARGET_FIRST_TOKEN_MS:g} ms)"
        )
    if args.write_docs:
        block = "gateway_overhead_own_cpu" if gateway_cpus else "gateway_overhead"
        write_block(args.doc, block, f"{body}\n\n{footer}", command)
        print(f"written: {args.doc}")


if __name__ == "__main__":
    main()
