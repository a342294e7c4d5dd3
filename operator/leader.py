"""Leader election on a `coordination.k8s.io/v1` Lease: exactly one replica of the operator drives Campaigns.

Every replica starts as a candidate (`LeaseElector.acquire`): it takes the Lease when nobody holds it, when
it is its own, or when the holder has not renewed it for `leaseDurationSeconds` (a replica that died, or is
partitioned from the API server). Writes carry the Lease's `resourceVersion`, so when two candidates race,
the API server lets one through and answers 409 to the other. The leader renews every `renew_s`
(`LeaseElector.hold`); when it cannot renew before its own lease would run out (the API unreachable, the
Lease taken over), it calls `on_lost` *before* another replica can take it (`renew_deadline_s` <
`lease_s`), and the operator fences itself: it stops driving (its campaign daemons end, pods keep running),
keeps serving `/healthz` and `/metrics`, and stands by as a candidate again, so an API outage of any length is
waited out, not crashed through. Whichever replica takes the Lease when the API returns adopts the running pods
(see `k8s_operator`). On SIGTERM the leader stops driving, then `release`s the Lease (holder cleared), so a
standby takes it on its next try instead of waiting for it to run out.

Every Lease call has a read time-out of `renew_deadline_s` (`LeaseElector.timeout`), and every try of the candidate
loop is bounded by it too: an API server that reads a request and never answers costs a try, not the loop, so a
standby keeps trying on schedule and takes over once the API answers, and a leader whose renewals hang fences.

Expiry follows client-go's observed-time rule: a candidate measures a holder's lease from the moment *it* last
saw the Lease's record change, on its own monotonic clock, never by comparing the holder's `renewTime` with its
own wall clock; replicas whose clocks disagree therefore never both lead.

This is client-go's leader election (`leaderelection.LeaderElector`) in the same terms: leaseDuration,
renewDeadline, retryPeriod; holderIdentity, acquireTime, renewTime, leaseTransitions; ReleaseOnCancel.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from labkube.operator.kube import answered

__all__ = ["LeaderElection", "LeaseElector"]

log = logging.getLogger("labkube.operator.leader")


class LeaderElection(BaseModel):
    """`leaderElection` in the operator's config."""

    model_config = ConfigDict(extra="forbid", validate_by_name=True, validate_by_alias=True, serialize_by_alias=True)

    enabled: bool = True
    lease_name: str = Field(default="labkube-operator", alias="leaseName")
    lease_s: float = Field(default=15.0, gt=0, alias="leaseSeconds", description="How long a lease lasts unrenewed.")
    renew_deadline_s: float = Field(
        default=10.0, gt=0, alias="renewDeadlineSeconds", description="The leader gives up if it cannot renew by then."
    )
    retry_s: float = Field(default=2.0, gt=0, alias="retrySeconds", description="How often to try and to renew.")


def _now() -> datetime:
    return datetime.now(UTC)


def _micro(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseElector:
    """One candidate for the Lease `namespace/name` (module docstring). `call` runs a blocking `kubernetes`
    client call off the event loop and raises its `ApiException`s; `clock` is the wall clock written into the
    Lease's times (only written, never compared: tests skew it)."""

    def __init__(
        self,
        client: Any,
        namespace: str,
        identity: str,
        settings: LeaderElection,
        call: Callable[..., Any] | None = None,
        clock: Callable[[], datetime] = _now,
    ) -> None:
        from kubernetes.client import CoordinationV1Api

        self.api = CoordinationV1Api(client)
        self.namespace = namespace
        self.identity = identity
        self.settings = settings
        self.call = call or (lambda fn, *a, **k: asyncio.to_thread(answered, fn, *a, **k))
        self.clock = clock
        self.renewed_at = -float("inf")  # monotonic time of the last successful acquire or renewal
        self.observed: dict[str, Any] | None = None  # the Lease's spec as this candidate last saw it
        self.observed_at = -float("inf")  # monotonic time at which `observed` was first seen

    @property
    def timeout(self) -> tuple[float, float]:
        """(connect, read) time-out of each Lease call: within the renew deadline, so a call the API server never
        answers ends (and frees its thread) by the time the leader must have renewed."""
        bound = self.settings.renew_deadline_s
        return (min(5.0, bound), bound)

    async def _read(self) -> dict[str, Any] | None:
        try:
            resp = await self.call(
                self.api.read_namespaced_lease,
                self.settings.lease_name,
                self.namespace,
                _preload_content=False,
                _request_timeout=self.timeout,
            )
        except Exception as exc:
            if getattr(exc, "status", None) == 404:
                return None
            raise
        import json

        return dict(json.loads(resp.data))

    def _spec(self, current: dict[str, Any] | None, now: datetime) -> dict[str, Any]:
        old = (current or {}).get("spec") or {}
        mine = old.get("holderIdentity") == self.identity
        spec = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.settings.lease_s)),
            "acquireTime": old.get("acquireTime") if mine else _micro(now),
            "renewTime": _micro(now),
            "leaseTransitions": int(old.get("leaseTransitions") or 0) + (0 if mine or current is None else 1),
        }
        return spec

    def _observe(self, spec: dict[str, Any], at: float) -> None:
        if spec != self.observed:
            self.observed, self.observed_at = dict(spec), at

    def held_by_another(self, spec: dict[str, Any], at: float) -> bool:
        """Whether another live holder has the Lease: its record changed less than `leaseDurationSeconds` ago by
        this candidate's monotonic clock (client-go's `isLeaseValid`). `renewTime` is not compared with any clock."""
        self._observe(spec, at)
        holder = spec.get("holderIdentity")
        if not holder or holder == self.identity:
            return False
        duration = float(spec.get("leaseDurationSeconds") or self.settings.lease_s)
        return at - self.observed_at < duration

    async def try_acquire(self) -> bool:
        """Take or renew the Lease once; False when another live holder has it or another candidate won the race."""
        started = time.monotonic()
        current = await self._read()
        now = self.clock()
        if current is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.settings.lease_name, "namespace": self.namespace},
                "spec": self._spec(None, now),
            }
            try:
                await self.call(
                    self.api.create_namespaced_lease,
                    self.namespace,
                    body,
                    _preload_content=False,
                    _request_timeout=self.timeout,
                )
            except Exception as exc:
                if getattr(exc, "status", None) == 409:
                    return False
                raise
            self._observe(body["spec"], started)
            self.renewed_at = started
            return True
        spec = current.get("spec") or {}
        holder = spec.get("holderIdentity")
        if self.held_by_another(spec, time.monotonic()):
            return False
        body = {**current, "spec": self._spec(current, now)}
        try:
            await self.call(
                self.api.replace_namespaced_lease,
                self.settings.lease_name,
                self.namespace,
                body,
                _preload_content=False,
                _request_timeout=self.timeout,
            )
        except Exception as exc:
            if getattr(exc, "status", None) == 409:  # another candidate wrote it first
                return False
            raise
        if holder != self.identity:
            log.warning("leader election: %s took the lease from %s", self.identity, holder or "nobody")
        self._observe(body["spec"], started)
        self.renewed_at = started
        return True

    async def acquire(self, stop: threading.Event | None = None) -> bool:
        """Until this candidate holds the Lease (True), or `stop` is set (False)."""
        log.info("leader election: %s waiting for lease %s/%s", self.identity, self.namespace, self.settings.lease_name)
        while stop is None or not stop.is_set():
            try:
                # bounded: a try the API server never answers must not stop the next one (`renew_deadline_s`)
                if await asyncio.wait_for(self.try_acquire(), self.settings.renew_deadline_s):
                    log.info("leader election: %s leads", self.identity)
                    return True
            except TimeoutError:
                log.warning(
                    "leader election: the API did not answer within %.0fs; trying again", self.settings.renew_deadline_s
                )
            except Exception as exc:  # the API unreachable: keep trying, as a candidate
                log.warning("leader election: %s", (str(exc).splitlines() or [type(exc).__name__])[0][:200])
            await _sleep_unless(stop, self.settings.retry_s)
        return False

    async def hold(self, on_lost: Callable[[], Any], stop: threading.Event | None = None) -> None:
        """Renew every `retry_s`; call `on_lost` once it cannot renew within `renew_deadline_s` of the last renewal
        (before the lease runs out for the others), or finds the Lease held by someone else. Returns without
        calling it once `stop` is set (the operator is shutting down and releases the Lease itself)."""
        while True:
            await _sleep_unless(stop, self.settings.retry_s)
            if stop is not None and stop.is_set():
                return
            try:
                if not await asyncio.wait_for(self.try_acquire(), self.settings.renew_deadline_s):
                    log.error("leader election: %s lost the lease to another replica", self.identity)
                    break
            except TimeoutError:
                log.warning(
                    "leader election: renewing: the API did not answer within %.0fs", self.settings.renew_deadline_s
                )
            except Exception as exc:
                log.warning("leader election: renewing: %s", (str(exc).splitlines() or [type(exc).__name__])[0][:200])
            if time.monotonic() - self.renewed_at > self.settings.renew_deadline_s:
                log.error(
                    "leader election: %s could not renew within %.0fs", self.identity, self.settings.renew_deadline_s
                )
                break
        self.renewed_at = -float("inf")
        result = on_lost()
        if asyncio.iscoroutine(result):
            await result

    async def release(self) -> bool:
        """Give the Lease up (client-go's ReleaseOnCancel): holder cleared, a 1 s duration, so a standby takes it on
        its next try. Only when this replica still holds it; call it after this replica stopped acting."""
        try:
            current = await self._read()
            spec = (current or {}).get("spec") or {}
            if current is None or spec.get("holderIdentity") != self.identity:
                return False
            now = _micro(self.clock())
            released = {**spec, "holderIdentity": None, "leaseDurationSeconds": 1, "acquireTime": now, "renewTime": now}
            await self.call(
                self.api.replace_namespaced_lease,
                self.settings.lease_name,
                self.namespace,
                {**current, "spec": released},
                _preload_content=False,
                _request_timeout=self.timeout,
            )
        except Exception as exc:  # the API unreachable or the Lease changed: it runs out on its own
            log.warning(
                "leader election: releasing the lease: %s", (str(exc).splitlines() or [type(exc).__name__])[0][:200]
            )
            return False
        self.renewed_at = -float("inf")
        log.info("leader election: %s released lease %s/%s", self.identity, self.namespace, self.settings.lease_name)
        return True


async def _sleep_unless(stop: threading.Event | None, seconds: float) -> None:
    """Sleep `seconds`, or less once `stop` (set from another thread) is set."""
    if stop is None:
        await asyncio.sleep(seconds)
        return
    deadline = time.monotonic() + seconds
    while not stop.is_set() and (left := deadline - time.monotonic()) > 0:
        await asyncio.sleep(min(left, 0.05))
