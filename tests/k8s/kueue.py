"""Kueue's pod integration, as much of it as a run's pod meets, for tests against the fake API (Kueue itself needs a
cluster). What it does, after Kueue's documented behaviour for plain pods (`integrations.frameworks: [pod]`):

- its mutating webhook gives every new pod with the label `kueue.x-k8s.io/queue-name` of a known LocalQueue the
  scheduling gate `kueue.x-k8s.io/admission` (a FakeKube admission hook: before the pod is stored, as a webhook);
- its controller admits gated pods in creation order while the ClusterQueue's quota (pods here) has room, by
  removing that gate (an update; the fake API, like the real one, refuses adding a gate after creation);
- `preempt(pod)` stops an admitted pod to make room as Kueue does: the condition `TerminationTarget=True`, reason
  `StoppedByKueue`, then the pod is deleted; its quota is freed.
"""

from __future__ import annotations

from typing import Any

from fakekube import FakeKube, ResKey, now_rfc3339

PODS: ResKey = ("", "v1", "pods")
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
GATE = "kueue.x-k8s.io/admission"


class FakeKueue:
    def __init__(self, api: FakeKube, queues: set[str], quota: int) -> None:
        self.api = api
        self.queues = queues
        self.quota = quota
        self.admitted: set[tuple[str, str]] = set()
        self.gated: list[tuple[str, str]] = []  # waiting, in creation order
        self.most_admitted = 0
        api.admission.append(self._webhook)
        api.listeners.append(self._hear)

    def _webhook(self, res: ResKey, pod: dict[str, Any]) -> None:
        if res != PODS or (pod["metadata"].get("labels") or {}).get(QUEUE_LABEL) not in self.queues:
            return
        gates = pod["spec"].setdefault("schedulingGates", [])
        if all(g.get("name") != GATE for g in gates):
            gates.append({"name": GATE})

    def _hear(self, type_: str, res: ResKey, obj: dict[str, Any]) -> None:
        if res != PODS:
            return
        key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
        gated = any(g.get("name") == GATE for g in (obj.get("spec") or {}).get("schedulingGates") or [])
        phase = (obj.get("status") or {}).get("phase")
        if type_ == "ADDED" and gated:
            self.gated.append(key)
        elif type_ == "DELETED" or phase in ("Succeeded", "Failed"):
            self.admitted.discard(key)
            if key in self.gated:
                self.gated.remove(key)
        else:
            return
        self._admit()

    def _admit(self) -> None:
        while self.gated and len(self.admitted) < self.quota:
            namespace, name = self.gated.pop(0)

            def ungate(pod: dict[str, Any]) -> None:
                gates = [g for g in pod["spec"].get("schedulingGates") or [] if g.get("name") != GATE]
                if gates:
                    pod["spec"]["schedulingGates"] = gates
                else:
                    pod["spec"].pop("schedulingGates", None)

            if self.api.update_object(PODS, namespace, name, ungate) is not None:
                self.admitted.add((namespace, name))
                self.most_admitted = max(self.most_admitted, len(self.admitted))

    def preempt(self, name: str, namespace: str = "default") -> None:
        current = self.api.read_object(PODS, namespace, name)
        assert current is not None, f"no pod {name}"
        status = current.get("status") or {}
        condition = {
            "type": "TerminationTarget",
            "status": "True",
            "reason": "StoppedByKueue",
            "message": "Preempted to accommodate a workload (UID: x) due to prioritization in the ClusterQueue",
            "lastTransitionTime": now_rfc3339(),
        }
        self.api.set_status(
            PODS, namespace, name, {**status, "conditions": [*(status.get("conditions") or []), condition]}
        )
        self.api.delete_object(PODS, namespace, name)
