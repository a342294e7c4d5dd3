"""The gateway as a pod's sidecar: `serve_run_gateway` runs it for a run directory (`labkube gateway`), and
`GatewayView` is how the agent container sees it, from its `/healthz` and `gateway.json`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from labkube.agent.gateway.proxy import AfterHook, GatewayAddress, Hook, ModelGateway
from labkube.agent.gateway.record import CallRecord
from labkube.agent.gateway.state import GatewayConfig, GatewayError, GatewayState, run_config, upstream_for
from labkube.agent.transcript import JsonlLog
from labkube.model_ref import parse_model
from labkube.run_spec import RUN_SPEC_VARIABLE, RunSpec

# Where a pod's gateway sidecar takes the run's spec (model, base URL, key variable, budgets, prices): its own
# container's environment, which the pod manifest sets from the Run and nothing in the pod can change, never the run
# folder's `run.json`, which the agent container may rewrite (issue 41: a rewritten base URL plus a sidecar restart
# sent the provider's key to the agent's own listener).
GATEWAY_URL_VARIABLE = "LABKUBE_GATEWAY_URL"  # set in a pod: the gateway is the `gateway` sidecar
GATEWAY_TOKEN_VARIABLE = "LABKUBE_GATEWAY_TOKEN_FILE"
STATE_TIMEOUT_S = 2.0  # a sidecar on the pod's loopback answers in milliseconds; a dead one must not stall the end


class GatewayView(GatewayAddress):
    """A gateway in another container of the pod (the `gateway` sidecar): its address, the token it wrote, and the
    totals it keeps in `gateway.json`, with the same attributes the CLI supervisor reads from a `ModelGateway`."""

    def __init__(self, url: str, token: str, state_path: Path) -> None:
        self.url = url.rstrip("/")
        self.config = GatewayConfig(token=token)
        self.state_path = state_path
        self.state = GatewayState()
        self.refresh()

    def refresh(self) -> None:
        """The gateway's totals as it last wrote them to `gateway.json` (off the calls' path, a moment after each
        answer; `checkpoint` asks the gateway itself)."""
        with contextlib.suppress(OSError, ValueError):
            self.state = GatewayState.model_validate_json(self.state_path.read_text())

    def checkpoint(self) -> int | None:
        """The gateway's counts, after it has written every call they count to the transcript (`POST /checkpoint`),
        and the offset where its transcript writes then end: the checkpoint keeps the transcript up to there at
        least, or a resumed run would truncate calls its spend counts. None where the gateway does not answer; the
        counts are then `gateway.json`'s (`refresh`)."""
        request = urllib.request.Request(
            f"{self.url}/checkpoint", data=b"", method="POST", headers={"authorization": f"Bearer {self.config.token}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=STATE_TIMEOUT_S) as answer:
                body = json.loads(answer.read())
            self.state = GatewayState.model_validate(body["state"])
        except (OSError, ValueError, KeyError, TypeError):
            self.refresh()
            return None
        end = body.get("transcript_end")
        return end if isinstance(end, int) else None

    async def close(self) -> None:
        return None


def world_clock_hooks(
    world_url: str | None, think_time_s: float | None, control_token: str | None = None
) -> tuple[Hook | None, AfterHook | None]:
    """In a Gaia2 pod the gateway sidecar stops the world sidecar's clock around each model call, as rg-agent does:
    the clock is charged the call's measured time (or the run's fixed think time). The clock is the controller's:
    `control_token` is the world's (`world_control_token`)."""
    if not world_url:
        return None, None
    from labkube.tasks.gaia2 import WorldClient

    client = WorldClient(world_url, control_token=control_token)

    async def pause() -> None:
        await client.pause_clock()

    async def resume(model_seconds: float) -> None:
        if think_time_s is None:
            await client.resume_clock("measured", seconds=model_seconds)
        else:
            await client.resume_clock("fixed", seconds=think_time_s)

    return pause, resume


def kept_run_token(fresh: str) -> str:
    """The run token this sidecar serves with: in a pod, the one an earlier instance of it kept in its own volume (the
    kubelet restarted it, and the agent's container goes on with that token; a new one would refuse all its calls),
    else `fresh`, kept there for a later instance. Outside a pod (no `PRIVATE_STATE_VARIABLE`): `fresh`."""
    from labkube.agent.gateway.ledger import private_state_path

    state = private_state_path()
    if state is None:
        return fresh
    kept = state.with_name(state.name + ".token")
    with contextlib.suppress(FileNotFoundError):
        token = kept.read_text().strip()
        if token:
            return token
    kept.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(kept, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as copy:
        copy.write(fresh)
    return fresh


def world_control_token() -> str | None:
    """The control token the pod's world sidecar wrote before it listened (`LABKUBE_WORLD_CONTROL_FILE`, on a memory
    volume), read before this gateway listens: the agent container starts only after, and the world removes the
    file once the harness has used it. So a copy stays in this container's HOME (the pod's `gateway-tmp`, a volume
    only it mounts) for this sidecar restarted by its kubelet. None where the pod has no world."""
    from labkube.tasks.gaia2.verdict_message import CONTROL_FILE_VARIABLE

    path = os.environ.get(CONTROL_FILE_VARIABLE)
    if not path:
        return None
    kept = Path.home() / ".labkube-world-control"
    for source in (Path(path), kept):
        with contextlib.suppress(FileNotFoundError):
            token = source.read_text().strip()
            if token and source != kept:
                fd = os.open(kept, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w") as copy:
                    copy.write(token)
            if token:
                return token
    raise GatewayError(
        f"the world sidecar left no control token at {path} (it writes one before it listens): "
        "see the pod's world container log"
    )


def gateway_run_spec(environ: Mapping[str, str] | None = None) -> RunSpec:
    """The run's spec as the pod manifest gave this container (`RUN_SPEC_VARIABLE`); `GatewayError` without it."""
    text = (os.environ if environ is None else environ).get(RUN_SPEC_VARIABLE)
    if not text:
        raise GatewayError(
            f"${RUN_SPEC_VARIABLE} is not set: the gateway takes the run's spec from its own environment (the pod "
            "manifest sets it), never from the run folder's run.json, which the agent's container can rewrite"
        )
    try:
        return RunSpec.model_validate_json(text)
    except ValueError as exc:
        raise GatewayError(f"${RUN_SPEC_VARIABLE} is not a run spec: {exc}") from None


async def serve_run_gateway(run_dir: Path, host: str, port: int, token_file: Path, spec: RunSpec) -> None:
    """The pod's gateway sidecar: the run's provider and budgets from `spec` (`gateway_run_spec`: this container's
    environment, not the run folder's run.json, which the agent writes), its key from this container's environment,
    the spend so far from the operator's record and its own HOME (`ledger.starting_spend`; never the run folder's
    checkpoint, which the agent's container writes); the token written to `token_file` (a volume shared with the
    agent container only), then serve until SIGTERM. Its totals go to its own HOME and its termination message
    (`ledger.keep_report`), where the operator reads them when the pod ends. An rg-agent run's harness writes the
    transcript of its own calls: the gateway writes none for it, and its world's clock is the harness's to stop."""
    import signal

    from labkube.agent.gateway.ledger import keep_report, starting_spend
    from labkube.agent.providers.registry import api_key_for
    from labkube.run_spec import CLI_AGENTS
    from labkube.store import RunDir

    rd = RunDir(run_dir)
    state = GatewayState(spend=starting_spend())  # its own state first, then the key
    ref = parse_model(spec.model)
    family, upstream = upstream_for(ref, api_key_for(ref, spec))
    config = run_config(spec, family, upstream)
    config = config.model_copy(update={"token": kept_run_token(config.token)})
    cli = spec.agent in CLI_AGENTS
    before, after = (
        world_clock_hooks(os.environ.get("LABKUBE_WORLD_URL"), spec.think_time_s, world_control_token())
        if cli
        else (None, None)
    )
    termination = os.environ.get("LABKUBE_TERMINATION_LOG")
    gateway = ModelGateway(
        config,
        transcript=JsonlLog(rd.transcript) if cli else None,
        state=state,
        state_path=rd.root / "gateway.json",
        before_call=before,
        after_call=after,
        # A call's transcript line is written on the next turn of the event loop, not once the calls in flight end:
        # the transcript a person follows in the pod stays current, and a gateway killed with its pod loses the
        # fewest lines. (The agent container has the rest flushed before it checkpoints: `GatewayView.checkpoint`.)
        max_defer_s=0.0,
        keep_state=lambda kept: keep_report(kept, Path(termination) if termination else None),
        # its record of the model's tool calls, in a folder only it writes (`record.py`; a pod on a shared claim)
        call_record=CallRecord.from_environment(),
    )
    gateway.write_state()  # the operator's record is the report until a call adds to it, a restart included
    await gateway.start(host, port)
    token_file.parent.mkdir(parents=True, exist_ok=True)
    staged = token_file.with_suffix(".tmp")
    staged.write_text(config.token)
    staged.replace(token_file)
    print(f"LISTENING {gateway.url}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await gateway.close()
        gateway.write_state()


def sidecar_gateway(environ: Mapping[str, str] | None = None, timeout_s: float = 60.0) -> GatewayView | None:
    """The pod's gateway sidecar, as its address and the token it wrote (waiting out a slow start); None outside a
    pod with one. rg-agent's own model calls go through it there: the keys are the sidecar's alone."""
    import time

    env = os.environ if environ is None else environ
    url = env.get(GATEWAY_URL_VARIABLE)
    if not url:
        return None
    token_file = Path(env.get(GATEWAY_TOKEN_VARIABLE, "/gateway/token"))
    deadline = time.monotonic() + timeout_s
    while not token_file.exists():
        if time.monotonic() > deadline:
            raise GatewayError(f"the gateway sidecar wrote no token to {token_file} in {timeout_s:.0f} s; see its log")
        time.sleep(0.2)
    run_dir = Path(env.get("LABKUBE_RUN_DIR", "."))
    return GatewayView(url, token_file.read_text().strip(), run_dir / "gateway.json")
