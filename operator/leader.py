"""Leader election on a `coordination.k8s.io/v1` Lease: exactly one replica of the operator drives Campaigns.

Every replica starts as a candidate (`LeaseElector.acquire`): it takes the Lease when nobody holds it, when
it is its own, or when the holder has not renewed it for `leaseDurationSeconds` (a replica that died, or is
partitioned from the API server). Writes carry the Lease's `resourceVersion`, so when two candidates race,
the API server lets one through and answers 409 to the other. The leader renews every `renew_s`
(`LeaseElector.hold`); when it cannot renew before its own lease would run out (the API unreachable, the
Lease taken over), it calls `on_lost` *before* another replica can take it (`renew_deadline_s` <
`lease_s`), and the operator stops driving: its campaign daemons end (pods keep running) and the process
exits, to come back as a candidate. The new leader adopts the running pods (see `k8s_operator`).

This is client-go's leader election (`leaderelection.LeaderElector`) in the same terms: leaseDuration,
renewDeadline, retryPeriod; holderIdentity, acquireTime, renewTime, leaseTransitions.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from labkube.operator.kube import answered, parse_time

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
    client call off the event loop and raises its `ApiException`s."""

    def __init__(
        self,
        client: Any,
        namespace: str,
        identity: str,
        settings: LeaderElection,
        call: Callable[..., Any] | None = None,
    ) -> None:
        from kubernetes.client import CoordinationV1Api

        self.api = CoordinationV1Api(client)
        self.namespace = namespace
        self.identity = identity
        self.settings = settings
        self.call = call or (lambda fn, *a, **k: asyncio.to_thread(answered, fn, *a, **k))
        self.renewed_at = -float("inf")  # monotonic time of the last successful acquire or renewal

    async def _read(self) -> dict[str, Any] | None:
        try:
            resp = await self.call(
                self.api.read_namespaced_lease, self.settings.lease_name, self.namespace, _preload_content=False
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

    async def try_acquire(self) -> bool:
        """Take or renew the Lease once; False when another live holder has it or another candidate won the race."""
        started = time.monotonic()
        current = await self._read()
        now = _now()
        if current is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.settings.lease_name, "namespace": self.namespace},
                "spec": self._spec(None, now),
            }
            try:
                await self.call(self.api.create_namespaced_lease, self.namespace, body, _preload_content=False)
            except Exception as exc:
                if getattr(exc, "status", None) == 409:
                    return False
                raise
            self.renewed_at = started
            return True
        spec = current.get("spec") or {}
        holder = spec.get("holderIdentity")
        renewed = parse_time(spec.get("renewTime")) or parse_time(spec.get("acquireTime"))
        duration = float(spec.get("leaseDurationSeconds") or self.settings.lease_s)
        expired = renewed is None or (now - renewed).total_seconds() > duration
        if holder and holder != self.identity and not expired:
            return False
        body = {**current, "spec": self._spec(current, now)}
        try:
            await self.call(
                self.api.replace_namespaced_lease,
                self.settings.lease_name,
                self.namespace,
                body,
                _preload_content=False,
            )
        except Exception as exc:
            if getattr(exc, "status", None) == 409:  # another candidate wrote it first
                return False
            raise
        if holder != self.identity:
            log.warning("leader election: %s took the lease from %s", self.identity, holder or "nobody")
        self.renewed_at = started
        return True

    async def acquire(self) -> None:
        """Until this candidate holds the Lease."""
        log.info("leader election: %s waiting for lease %s/%s", self.identity, self.namespace, self.settings.lease_name)
        while True:
            try:
                if await self.try_acquire():
                    log.info("leader election: %s leads", self.identity)
                    return
            except Exception as exc:  # the API unreachable: keep trying, as a candidate
                log.warning("leader election: %s", str(exc).splitlines()[0][:200])
            await asyncio.sleep(self.settings.retry_s)

    async def hold(self, on_lost: Callable[[], Any]) -> None:
        """Renew every `retry_s`; call `on_lost` once it cannot renew within `renew_deadline_s` of the last renewal
        (before the lease runs out for the others), or finds the Lease held by someone else."""
        while True:
            await asyncio.sleep(self.settings.retry_s)
            try:
                if not await asyncio.wait_for(self.try_acquire(), self.settings.renew_deadline_s):
                    log.error("leader election: %s lost the lease to another replica", self.identity)
                    break
            except Exception as exc:
                log.warning("leader election: renewing: %s", str(exc).splitlines()[0][:200] or type(exc).__name__)
            if time.monotonic() - self.renewed_at > self.settings.renew_deadline_s:
                log.error(
                    "leader election: %s could not renew within %.0fs", self.identity, self.settings.renew_deadline_s
                )
                break
        result = on_lost()
        if asyncio.iscoroutine(result):
            await result
