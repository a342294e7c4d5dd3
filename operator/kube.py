"""Reaching a Kubernetes API server: a kubeconfig context, the pod's service account, or a bare URL.

`KubeTarget` says where the API is and is small enough to hand to a Ray worker, which builds its
own client from it (clients hold sockets and threads; they do not pickle). Every failure to load a
configuration or to reach the server is one `KubeError` with a one-line message that names the
context or the address and what to do:

    KubeError
      "kube context `prod` not found in ~/.kube/config (contexts: dev, kind-labkube); ..."
      "cannot reach the Kubernetes API at https://10.0.0.1:6443 (context dev): connection refused"

Precedence: `server` (an unauthenticated URL: tests, `kubectl proxy`) > `context`/`kubeconfig` >
the pod's service account (in a cluster) > the kubeconfig's current context.

Calling it: `answered` reads a response's body so its connection goes back to the pool, `retrying` waits
out what a recovering or throttling API server answers (connection errors, 429, 5xx, 410) with capped
exponential back-off and jitter, and `raw_json` reads a `_preload_content=False` body. The operator's own
calls (`cluster_api`) and the run supervisors' (`kube_session`) both go through them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    import kopf
    from kubernetes.client import ApiClient, Configuration

__all__ = [
    "PATIENCE_S",
    "QUOTA_REFUSALS",
    "REQUEST_TIMEOUT",
    "TRANSIENT",
    "KubeError",
    "KubeTarget",
    "allocatable_gpus",
    "answered",
    "api_client",
    "api_message",
    "backoff_delay",
    "check_reachable",
    "connection_info",
    "default_namespace",
    "largest_node_gpus",
    "last_answer",
    "list_pages",
    "load_configuration",
    "node_gpu_figures",
    "parse_time",
    "quota_refusal",
    "raw_json",
    "retry_after",
    "retrying",
    "status_of",
]

log = logging.getLogger("labkube.operator.k8s")

_SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class KubeError(RuntimeError):
    """The Kubernetes API cannot be used: no configuration, an unknown context, or no answer."""


class KubeTarget(BaseModel):
    """Where the Kubernetes API is (JSON-serialisable, so a Ray worker can rebuild the client)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    server: str | None = Field(default=None, description="API server URL used without credentials.")
    context: str | None = Field(default=None, description="kubeconfig context (default: the current one).")
    kubeconfig: str | None = Field(default=None, description="kubeconfig file (default: $KUBECONFIG, ~/.kube/config).")

    def describe(self) -> str:
        if self.server:
            return self.server
        if self.context:
            return f"context {self.context}"
        return "the current kubeconfig context" if not _in_cluster() else "the in-cluster service account"


T = TypeVar("T")


def _in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and (_SERVICE_ACCOUNT / "token").exists()


def _kubeconfig_path(target: KubeTarget) -> str:
    if target.kubeconfig:
        return str(Path(target.kubeconfig).expanduser())
    env = os.environ.get("KUBECONFIG", "")
    first = next((p for p in env.split(os.pathsep) if p), "")
    return str(Path(first or "~/.kube/config").expanduser())


def short_error(exc: BaseException) -> str:
    """The first line of what `exc` says (its type's name when it says nothing, as a bare time-out)."""
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def _contexts(path: str) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    from kubernetes.config import ConfigException, list_kube_config_contexts

    if not Path(path).exists():
        raise KubeError(
            f"no kubeconfig at {path}: pass --kube-context with a kubeconfig ($KUBECONFIG), or run inside the cluster"
        )
    try:
        contexts, current = list_kube_config_contexts(config_file=path)
    except (ConfigException, OSError, ValueError) as exc:
        raise KubeError(f"{path}: not a usable kubeconfig ({short_error(exc)})") from None
    return list(contexts or []), current


def load_configuration(target: KubeTarget) -> Configuration:
    """A `kubernetes.client.Configuration` for `target`. Raises `KubeError`."""
    from kubernetes.client import Configuration
    from kubernetes.config import ConfigException, load_incluster_config, load_kube_config

    config = Configuration()
    if target.server:
        config.host = target.server.rstrip("/")
        return config
    if target.context is None and target.kubeconfig is None and _in_cluster():
        try:
            load_incluster_config(client_configuration=config)
        except ConfigException as exc:
            raise KubeError(f"in-cluster configuration: {short_error(exc)}") from None
        return config
    path = _kubeconfig_path(target)
    contexts, current = _contexts(path)
    names = [c.get("name") for c in contexts]
    if target.context is not None and target.context not in names:
        known = ", ".join(str(n) for n in names) or "none"
        raise KubeError(
            f"kube context `{target.context}` not found in {path} (contexts: {known}); "
            "see `kubectl config get-contexts`"
        )
    if target.context is None and current is None:
        raise KubeError(f"{path} has no current context: pass --kube-context")
    try:
        load_kube_config(config_file=path, context=target.context, client_configuration=config, persist_config=False)
    except (ConfigException, OSError, ValueError) as exc:
        name = target.context or (current or {}).get("name")
        raise KubeError(f"kube context `{name}` in {path}: {short_error(exc)}") from None
    return config


def default_namespace(target: KubeTarget) -> str:
    """The namespace a client would use: the context's, the pod's own, else `default`."""
    if target.server:
        return "default"
    if target.context is None and target.kubeconfig is None and _in_cluster():
        try:
            return (_SERVICE_ACCOUNT / "namespace").read_text().strip() or "default"
        except OSError:
            return "default"
    contexts, current = _contexts(_kubeconfig_path(target))
    chosen = next((c for c in contexts if c.get("name") == target.context), None) if target.context else current
    return str(((chosen or {}).get("context") or {}).get("namespace") or "default")


# Every request of a client made by `api_client` is bounded: (connect, read) seconds unless the call passes its own
# `_request_timeout` (a watch passes a read time-out longer than its `timeoutSeconds`). An API server that accepts a
# request and never answers costs a call this long, never a thread for good.
REQUEST_TIMEOUT = (5.0, 30.0)
_last_answer = -float("inf")  # monotonic time of the last HTTP answer any such client had (whatever its status)


def last_answer() -> float:
    """Monotonic time at which a client of this process (`api_client`) last had an answer from an API server, of any
    status (a 503 is an answer: the server is there); -inf before the first. `/healthz` watches it."""
    return _last_answer


def api_client(target: KubeTarget, *, pool_size: int | None = None) -> ApiClient:
    """A client of `target`'s API server (not yet contacted), its requests bounded by `REQUEST_TIMEOUT`."""
    import urllib3

    config = load_configuration(target)
    if pool_size is not None:
        config.connection_pool_maxsize = pool_size
    if config.retries is None:
        # urllib3 would read a GET or PUT again after a read time-out, 3 times: 4 x the read time-out in all.
        # Connection errors are still retried here; a read that timed out is the caller's (`retrying`).
        config.retries = urllib3.Retry(3, read=0)
    return _bounded_client_class()(configuration=config)


_BOUNDED: type | None = None


def _bounded_client_class() -> type:
    """`kubernetes.client.ApiClient` whose every request has `REQUEST_TIMEOUT` unless given one, and records
    `last_answer` (made on first use: the kubernetes client is imported lazily)."""
    global _BOUNDED
    if _BOUNDED is None:
        from kubernetes.client import ApiClient

        class BoundedApiClient(ApiClient):  # type: ignore[misc]
            def call_api(self, *args: Any, _request_timeout: Any = None, **kwargs: Any) -> Any:
                global _last_answer
                timeout = REQUEST_TIMEOUT if _request_timeout is None else _request_timeout
                resp = super().call_api(*args, _request_timeout=timeout, **kwargs)
                _last_answer = time.monotonic()
                return resp

        _BOUNDED = BoundedApiClient
    return _BOUNDED


def check_reachable(client: ApiClient, target: KubeTarget, timeout_s: float = 5.0) -> None:
    """Ask the server for its version; any failure is one `KubeError` line."""
    from kubernetes.client import ApiException, VersionApi

    host = client.configuration.host
    where = host if target.server or not target.context else f"{host} (context {target.context})"
    try:
        VersionApi(client).get_code(_request_timeout=timeout_s)
    except ApiException as exc:
        hint = " (check the credentials of the context)" if exc.status in (401, 403) else ""
        raise KubeError(f"the Kubernetes API at {where} answered {exc.status} {exc.reason}{hint}") from None
    except Exception as exc:  # urllib3 errors, DNS, TLS: one line, no traceback
        reason = short_error(exc)
        if "Connection refused" in reason or "NewConnectionError" in reason:
            reason = "connection refused"
        elif "timed out" in reason or "Timeout" in reason:  # the text carries the time left, different every try
            reason = f"no answer within {timeout_s:g}s"
        raise KubeError(f"cannot reach the Kubernetes API at {where}: {reason}") from None


def connection_info(target: KubeTarget) -> kopf.ConnectionInfo:
    """kopf's credentials for `target` (for an `@kopf.on.login` handler)."""
    import kopf

    config = load_configuration(target)
    header = config.get_api_key_with_prefix("BearerToken") or config.get_api_key_with_prefix("authorization")
    parts = header.split(" ", 1) if header else []
    scheme, token = (None, None) if not parts else (None, parts[0]) if len(parts) == 1 else (parts[0], parts[1])
    return kopf.ConnectionInfo(
        server=config.host,
        ca_path=config.ssl_ca_cert,
        insecure=not config.verify_ssl,
        username=config.username or None,
        password=config.password or None,
        scheme=scheme,
        token=token,
        certificate_path=config.cert_file,
        private_key_path=config.key_file,
    )


def answered(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn(...)` with its response's body read. A `_preload_content=False` response keeps its connection until its
    body is read: one nobody reads (a status patch, a delete) would leave the pool to open a new connection for the
    next call, on a real cluster a TLS handshake per status patch."""
    resp = fn(*args, **kwargs)
    if kwargs.get("_preload_content") is False:
        _ = cast(Any, resp).data  # read and kept (raw_json reads it again); the connection goes back to the pool
    return resp


LIST_PAGE = 500  # items per page of a list (`limit`): kube-apiserver's own default chunk for kubectl


def list_pages(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Every item of a list call (`fn`, e.g. `CoreV1Api.list_namespaced_pod`), read page by page with `limit` and
    `_continue` as kube-apiserver pages a long list, as one list: `items` all of them, `metadata.resourceVersion`
    the list's (every page reports the first page's, which a watch can start from). A page's error is raised: an
    expired continue token (410) is transient to `retrying`, which then lists again from the start."""
    items: list[Any] = []
    token: str | None = None
    while True:
        page = kwargs | ({"_continue": token} if token else {})
        listing = raw_json(answered(fn, *args, limit=LIST_PAGE, _preload_content=False, **page))
        items.extend(listing.get("items") or [])
        meta = listing.get("metadata") or {}
        token = meta.get("continue") or None
        if token is None:
            return {**listing, "metadata": {**meta, "continue": ""}, "items": items}


def parse_time(text: object) -> datetime | None:
    """A Kubernetes timestamp (RFC 3339, `Time` or `MicroTime`) as an aware datetime; None when absent or malformed."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def allocatable_gpus(client: ApiClient, resource: str) -> int | None:
    """The cluster's GPUs (`resource`, e.g. nvidia.com/gpu) that pods can be given: the sum of `status.allocatable`
    over Ready, schedulable nodes. None if the operator may not list nodes (say so, and let the scheduler bound)."""
    figures = node_gpu_figures(client, resource)
    return None if figures is None else figures[0]


def node_gpu_figures(client: ApiClient, resource: str) -> tuple[int, int] | None:
    """The cluster's allocatable GPUs (`resource`) in all and on its largest node (Ready, schedulable nodes); None if
    the operator may not list nodes."""
    from kubernetes.client import ApiException, CoreV1Api

    try:
        nodes = list_pages(CoreV1Api(client).list_node, _request_timeout=30)["items"]
    except ApiException as exc:
        if exc.status in (401, 403, 404):
            return None
        raise
    counts = _node_gpus(nodes, resource)
    return sum(counts), max(counts, default=0)


def _node_gpus(nodes: list[dict[str, Any]], resource: str) -> list[int]:
    """The allocatable `resource` of each Ready, schedulable node of `nodes` (a node list's items)."""
    counts = []
    for node in nodes:
        status = node.get("status") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
        if (node.get("spec") or {}).get("unschedulable") or not ready:
            continue
        text = str((status.get("allocatable") or {}).get(resource, "0"))
        counts.append(int(text) if text.isdigit() else 0)
    return counts


def largest_node_gpus(nodes: list[dict[str, Any]], resource: str) -> int:
    """The most GPUs (`resource`) one pod can be given: the largest allocatable of a Ready, schedulable node of
    `nodes` (0 when there is none). A run needing more stays Unschedulable whatever the cluster's total."""
    return max(_node_gpus(nodes, resource), default=0)


def raw_json(resp: object) -> dict[str, Any]:
    """The body of a `_preload_content=False` response (a urllib3 response, whatever the annotation says)."""
    return cast(dict[str, Any], json.loads(cast(Any, resp).data))


def status_of(exc: BaseException) -> int | None:
    """The HTTP status of an API error; None for anything else (a connection error, a bug)."""
    return getattr(exc, "status", None)


# What kube-apiserver's ResourceQuota admission answers (403 Forbidden) when a create would pass a quota, or while it
# has not yet computed a new quota's usage: `pods "x" is forbidden: exceeded quota: gpu, requested: ..., used: ...,
# limited: ...`, `... forbidden: status unknown for quota: gpu, resource: requests.nvidia.com/gpu`. Both pass once
# pods end or the quota controller catches up: transient to a caller that waits (`PodRun.past_quota`), not final.
QUOTA_REFUSALS = ("exceeded quota:", "status unknown for quota:")


def api_message(exc: BaseException) -> str:
    """The `message` of the Status an API error carries (its body), else its reason or text."""
    body = getattr(exc, "body", None)
    if body:
        try:
            message = json.loads(body).get("message")
        except (TypeError, ValueError, AttributeError):
            message = None
        if isinstance(message, str) and message:
            return message
    return str(getattr(exc, "reason", None) or exc)


def quota_refusal(exc: BaseException) -> str | None:
    """The API server's message when `exc` is a ResourceQuota refusing a create (403 with `exceeded quota:` or
    `status unknown for quota:`); None for anything else, a 403 of RBAC included (that one is final)."""
    if status_of(exc) != 403:
        return None
    message = api_message(exc)
    return message if any(m in message for m in QUOTA_REFUSALS) else None


TRANSIENT = frozenset({429, 500, 502, 503, 504})
PATIENCE_S = 3600.0  # how long a call without a deadline of its own waits out the API (a control-plane upgrade)
BACKOFF_CAP_S = 30.0


def backoff_delay(attempt: int, first_s: float = 0.5, cap_s: float = BACKOFF_CAP_S) -> float:
    """Capped exponential back-off with jitter: uniformly between half and all of min(cap, first x 2^attempt),
    so the supervisors of a thousand runs do not come back to a recovering API server in one burst."""
    ceiling = min(cap_s, first_s * 2.0**attempt)
    return random.uniform(ceiling / 2, ceiling)


def retry_after(exc: BaseException) -> float | None:
    """The seconds a 429 or 503 asks for (`Retry-After`), if it says."""
    headers = getattr(exc, "headers", None) or {}
    value = headers.get("Retry-After") or headers.get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except (TypeError, ValueError):
        return None


async def retrying(
    call: Callable[[], Awaitable[T]],
    *,
    patience_s: float | None = None,
    first_delay_s: float = 0.5,
    conflicts: bool = False,
) -> T:
    """`call()`, again after a connection error, a 429/5xx or a 410 (the API server restarting, throttling, a
    control-plane upgrade), for as long as `patience_s` allows (the caller's own deadline: a run's time budget;
    default an hour), with capped exponential back-off and jitter, or the `Retry-After` the server asks for.
    Other API errors (403, 404, 409, 422, ...) are the caller's: a ResourceQuota's 403 (`quota_refusal`) is waited
    out by the run supervisor outside its turn, with the Run showing why (`PodRun.past_quota`). A create retried
    after a lost answer answers 409, which the callers treat as "exists". With `conflicts`, a 409 Conflict is
    retried too: for writes that are safe to repeat as they are (a merge patch of a status carries no
    resourceVersion)."""
    give_up_at = time.monotonic() + (PATIENCE_S if patience_s is None else patience_s)
    attempt = 0
    while True:
        try:
            return await call()
        except Exception as exc:
            status = status_of(exc)
            transient = status in TRANSIENT or status == 410 or (conflicts and status == 409)
            transient = transient or (status is None and _is_connection_error(exc))
            delay = max(backoff_delay(attempt, first_delay_s), retry_after(exc) or 0.0)
            if not transient or time.monotonic() + delay > give_up_at:
                raise
            if attempt < 3 or attempt % 10 == 0:  # a long outage logs a line every few minutes, not every try
                log.warning("kubernetes API: %s; retrying in %.1fs", short_error(exc), delay)
            await asyncio.sleep(delay)
            attempt += 1


def _is_connection_error(exc: BaseException) -> bool:
    import urllib3.exceptions

    return isinstance(exc, urllib3.exceptions.HTTPError | ConnectionError | TimeoutError)
