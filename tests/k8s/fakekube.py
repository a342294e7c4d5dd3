"""A Kubernetes API server for tests: kmock's scaffold (aiohttp server, discovery, error bodies)
with a stateful API that behaves like kube-apiserver where kopf and the `kubernetes` client care.

kmock's own emulator lacks, and this subclass adds (DESIGN.md, "Testing without a cluster"):

- `metadata.resourceVersion` (one counter for the server), `uid`, `generation` (bumped when
  anything outside metadata and status changes), `creationTimestamp`, `generateName`;
- JSON patch with a failing `test` answers 422 (kopf's finalizer patches rely on it), merge and
  strategic-merge patches merge as RFC 7386, PUT replaces (409 on a stale resourceVersion);
  a strategic-merge patch of a custom resource answers 415, as kube-apiserver does (custom
  resources have no patch strategies);
- custom resources are pruned by their CRD's structural schema on every write: a field the schema
  does not declare is dropped (kept under `x-kubernetes-preserve-unknown-fields`), as the API
  server does, so code that writes a field the CRD lacks loses it here too;
- `/status` is a subresource: a patch of the object ignores its status, a patch of `/status`
  changes only the status, a create drops the status of resources with the subresource;
- finalizers: a DELETE of an object with finalizers sets `deletionTimestamp`; removing the last
  finalizer deletes it; a DELETE's `preconditions` (uid, resourceVersion) answer 409 when they do not match;
- the garbage collector (kube-controller-manager's, in background propagation): when an object is
  removed, the objects of its namespace whose every owner reference is now gone are deleted soon
  after (their finalizers respected), and so is an object created with owners none of which exist;
  its deletions are audited as `gc-delete`, not as a client's `delete`;
- a consistent watch: every change is logged with its resourceVersion, and a watch from
  `?resourceVersion=N` replays what came after N before it follows new changes (410 when N is
  older than the log); without one it starts with ADDED events of the current objects; it honours
  `timeoutSeconds` and sends BOOKMARKs when idle;
- label selectors (`=`, `==`, `!=`, `in`, `notin`, `key`, `!key`) and `metadata.name`/
  `metadata.namespace` field selectors on lists and watches; lists carry `kind` and `apiVersion`;
- the CRDs themselves under apiextensions.k8s.io (kopf's resource scanning reads them); a CRD written through the
  API (created, patched, applied) is served from then on with its new schema, as kube-apiserver does;
- server-side apply (`PATCH` as `application/apply-patch+yaml`): `fieldManager` required, the body's name must be
  the URL's, a missing object is created. More lenient than kube-apiserver: no `managedFields` are kept, so there
  is never a 409 for a field another manager owns, and the applied object is merged as a JSON merge patch (a field
  this manager applied before and no longer sends is kept, where the real server would drop it);
- CRDs older than the operator (`serve_older_crds`): the Run CRD of an older chart, whose status lacks the newer
  fields, so they are pruned from every status patch that answers 200;
- pod deletion: more lenient than kube-apiserver, which keeps a gracefully deleted pod Terminating until its node's
  kubelet confirms: here it goes at once (the fake kubelet would confirm at once), except for pods no kubelet will
  confirm (`awaits_kubelet`, a dead node's: `FakeKubelet.lose_node`), which stay Terminating with their
  `deletionTimestamp` until a DELETE with `gracePeriodSeconds: 0`; the scheduler's binding (`bind_pod`) sets
  `spec.nodeName`;
- `GET /api/v1/namespaces`, which kmock's own path parser fails on (kopf lists namespaces when it
  watches given ones).

The kubelet and the tests use it in-process (`read_object`, `objects`, `create_object`,
`set_status`, `delete_object`), on the
same event loop as the server; `listeners` hear every change.

Faults: a test's own kmock reactions (`api[criteria] << payload`, not the scaffold's fallbacks)
are consulted before the stateful API, so `api[kmock.action.CREATE, kmock.resource("v1/pods")] <<
callback` can answer instead of it (a callback may raise `KubeError` for a Status error, or return
`NotImplemented` to let the request through; that retires the reaction, as in kmock);
`expire_watches()` ends every open watch with 410 Gone, as a restarted API server's watch cache does.
`hang(matches)` holds every request (or those of matching paths) with no answer, as an API server that reads a
request and never answers does (`Hang`).
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import collections
import copy
import json
import math
import random
import re
import string
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp.web
import jsonpatch
import kmock
import yaml
from kube_schema import prune

from labkube.operator.crds import campaign_crd, run_crd

ResKey = tuple[str, str, str]  # group, version, plural
ObjKey = tuple[str, str, str, str, str]  # group, version, plural, namespace ("" if cluster-scoped), name
Listener = Callable[[str, ResKey, dict[str, Any]], None]

ALL_VERBS = {"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"}
CRDS: ResKey = ("apiextensions.k8s.io", "v1", "customresourcedefinitions")
APPLY = "application/apply-patch+yaml"


@dataclass(frozen=True)
class Kind:
    kind: str
    namespaced: bool
    subresources: frozenset[str]
    short: frozenset[str] = frozenset()
    categories: frozenset[str] = frozenset()


BUILTIN: dict[ResKey, Kind] = {
    ("", "v1", "pods"): Kind("Pod", True, frozenset({"status", "log", "eviction"}), frozenset({"po"})),
    ("", "v1", "persistentvolumeclaims"): Kind("PersistentVolumeClaim", True, frozenset({"status"})),
    ("", "v1", "events"): Kind("Event", True, frozenset()),
    ("", "v1", "namespaces"): Kind("Namespace", False, frozenset({"status"})),
    ("", "v1", "nodes"): Kind("Node", False, frozenset({"status"}), frozenset({"no"})),
    ("", "v1", "secrets"): Kind("Secret", True, frozenset()),
    ("", "v1", "configmaps"): Kind("ConfigMap", True, frozenset(), frozenset({"cm"})),
    ("networking.k8s.io", "v1", "networkpolicies"): Kind("NetworkPolicy", True, frozenset()),
    ("coordination.k8s.io", "v1", "leases"): Kind("Lease", True, frozenset()),
    ("events.k8s.io", "v1", "events"): Kind("Event", True, frozenset()),
    ("apiextensions.k8s.io", "v1", "customresourcedefinitions"): Kind(
        "CustomResourceDefinition", False, frozenset({"status"})
    ),
}

_STATUS_CODES = {400: "BadRequest", 404: "NotFound", 405: "MethodNotAllowed", 409: "Conflict", 410: "Expired"}


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- selectors -------------------------------------------------------------------------------------

_TERM_SET = re.compile(r"^([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)$")
_TERM_EQ = re.compile(r"^([\w./-]+)\s*(==|=|!=)\s*([\w./-]*)$")
_TERM_EXISTS = re.compile(r"^(!?)([\w./-]+)$")


def _split_terms(text: str) -> list[str]:
    terms, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            terms.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        terms.append(cur.strip())
    return terms


def label_matcher(selector: str | None) -> Callable[[dict[str, str]], bool]:
    """A predicate over a labels dict for a Kubernetes label selector string."""
    # (key, operator, values): `in`/`notin` (values), `=`/`!=` (one value), `exists`/`!exists`
    checks: list[tuple[str, str, frozenset[str]]] = []
    for term in _split_terms(selector or ""):
        if m := _TERM_SET.match(term):
            values = frozenset(v.strip() for v in m.group(3).split(",") if v.strip())
            checks.append((m.group(1), m.group(2), values))
        elif m := _TERM_EQ.match(term):
            key, op, value = m.groups()
            checks.append((key, "notin" if op == "!=" else "in", frozenset({value})))
        elif m := _TERM_EXISTS.match(term):
            neg, key = m.groups()
            checks.append((key, "!exists" if neg else "exists", frozenset()))
        else:
            raise ValueError(f"unable to parse requirement: {term!r}")

    def match(labels: dict[str, str]) -> bool:
        for key, op, values in checks:
            if op == "in" and labels.get(key) not in values:
                return False
            if op == "notin" and labels.get(key) in values:
                return False
            if (op == "exists") != (key in labels) and op in ("exists", "!exists"):
                return False
        return True

    return match


def field_matcher(selector: str | None) -> Callable[[dict[str, Any]], bool]:
    checks: list[tuple[str, str, bool]] = []
    for term in _split_terms(selector or ""):
        neg = "!=" in term
        path, _, value = term.partition("!=" if neg else "=")
        checks.append((path.strip().lstrip("="), value.strip().lstrip("="), neg))

    def match(obj: dict[str, Any]) -> bool:
        for path, value, neg in checks:
            cur: Any = obj
            for part in path.split("."):
                cur = cur.get(part) if isinstance(cur, dict) else None
            if (str(cur) == value) == neg:
                return False
        return True

    return match


# -- the server ------------------------------------------------------------------------------------


@dataclass
class Event:
    rv: int
    res: ResKey
    namespace: str
    type: str
    obj: dict[str, Any]
    _line: bytes | None = None

    @property
    def line(self) -> bytes:
        """The event as one line of a watch stream (serialized once for every watcher)."""
        if self._line is None:
            self._line = json.dumps({"type": self.type, "object": self.obj}).encode() + b"\n"
        return self._line


class KubeError(Exception):
    def __init__(self, code: int, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason or _STATUS_CODES.get(code, "Invalid" if code == 422 else "InternalError")


class Outage:
    """A kmock reaction (`api[lambda _: True] << Outage(60)`): every HTTP request answers 503 for `seconds`, as a
    control-plane upgrade looks from outside; then it retires. Requests the kubelet and the test make in-process are
    not HTTP and go on: the pods keep running."""

    def __init__(self, seconds: float) -> None:
        self.until = time.monotonic() + seconds
        self.hits = 0

    @property
    def over(self) -> bool:
        return time.monotonic() >= self.until

    def __call__(self, request: kmock.Request) -> Any:
        if self.over:
            return NotImplemented
        self.hits += 1
        raise KubeError(503, "injected outage (fault test): the API server is being upgraded", "ServiceUnavailable")


class Hang:
    """An API server that reads a request and never answers (`FakeKube.hang`): every HTTP request whose path
    `matches` (default: every request, `/version` included) that arrives while the hang is on is held open with no
    answer until `release` (a client without a read time-out waits for good). `lift` ends the hang for requests that
    arrive from then on (the server answers again); the ones held stay held until `release`, which answers them 504
    (the client gave up on them long ago). `FakeKube.close_watches` releases every hang."""

    def __init__(self, matches: Callable[[str], bool] | None = None) -> None:
        self.matches = matches or (lambda _path: True)
        self.on = True
        self.held = 0  # requests held so far
        self.released = asyncio.Event()

    def lift(self) -> None:
        self.on = False

    def release(self) -> None:
        self.on = False
        self.released.set()

    async def hold(self) -> aiohttp.web.Response:
        self.held += 1
        await self.released.wait()
        body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 504, "reason": "Timeout"}
        return aiohttp.web.json_response({**body, "message": "held without an answer (fault test)"}, status=504)


class FakeKube(kmock.KubernetesScaffold):
    """See the module docstring."""

    def __init__(self, *, max_log: int = 200_000, bookmark_s: float = 10.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fallback["get /version/"] << self._serve_server_version  # the kubernetes client's path
        self.kinds: dict[ResKey, Kind] = {}
        self.schemas: dict[ResKey, dict[str, Any]] = {}  # custom resources: the CRD version's openAPIV3Schema
        self.store: dict[ObjKey, dict[str, Any]] = {}
        self.uids: dict[str, ObjKey] = {}  # the garbage collector's view: live objects by uid
        self.owned: dict[str, set[ObjKey]] = {}  # owner uid -> the objects naming it in their ownerReferences
        self.rv = 0
        self.log: list[Event] = []
        self.log_base = 0  # events trimmed from the front of the log
        self.max_log = max_log
        self.bookmark_s = bookmark_s
        self.bell = asyncio.Event()
        self.listeners: list[Listener] = []
        # mutating admission (what a webhook such as Kueue's does to a pod at creation): called with the resource
        # and the new object before it is stored
        self.admission: list[Callable[[ResKey, dict[str, Any]], None]] = []
        self.audit: list[tuple[str, str, str, str]] = []  # (verb, plural, namespace, name) of writes
        self.keep_requests = True
        self.request_counts: collections.Counter[str] = collections.Counter()  # "get"/"list"/"watch"/... served
        self.closing = False
        self.watch_epoch = 0  # bumped by `expire_watches`
        self.expired_rv = 0  # a watch from an older resourceVersion answers 410 Gone
        self.hangs: list[Hang] = []  # `hang`: requests held with no answer
        # Pods whose graceful DELETE leaves them Terminating (`deletionTimestamp` set, the object kept) until a kubelet
        # confirms: kube-apiserver keeps every such pod, and only its node's kubelet removes it (with
        # `gracePeriodSeconds: 0`). The fake kubelet confirms at once, so this holds only where no kubelet will: the
        # pods of a node that died (`FakeKubelet.lose_node`). A DELETE with `gracePeriodSeconds: 0` removes any pod.
        self.awaits_kubelet: Callable[[dict[str, Any]], bool] = lambda pod: False
        for res, kind in BUILTIN.items():
            self.add_kind(res, kind)
        for crd in (campaign_crd(), run_crd()):
            self.add_crd(crd)

    def hang(self, matches: Callable[[str], bool] | None = None) -> Hang:
        """From now on, hold every HTTP request whose path `matches` (default: all) with no answer (`Hang`)."""
        hang = Hang(matches)
        self.hangs.append(hang)
        return hang

    def close_watches(self) -> None:
        """End every open watch stream and release every held request (before the server stops: it waits for open
        requests)."""
        for hang in self.hangs:
            hang.release()
        self.closing = True
        bell, self.bell = self.bell, asyncio.Event()
        bell.set()

    def expire_watches(self) -> None:
        """Every open watch gets one ERROR 410 (too old resource version) and ends; a watch from a
        resourceVersion before now answers the same, so clients must list again."""
        self.rv += 1
        self.expired_rv = self.rv
        self.watch_epoch += 1
        bell, self.bell = self.bell, asyncio.Event()
        bell.set()

    # -- resources ---------------------------------------------------------------------------------

    def add_kind(self, res: ResKey, kind: Kind) -> None:
        self.kinds[res] = kind
        self.resources["/".join(p for p in res if p)] = kmock.ResourceInfo(
            kind=kind.kind,
            singular=kind.kind.lower(),
            namespaced=kind.namespaced,
            verbs=ALL_VERBS,
            shortnames=set(kind.short),
            categories=set(kind.categories),
            subresources=set(kind.subresources),
        )

    def add_crd(self, crd: dict[str, Any]) -> None:
        self.create_object(CRDS, "", copy.deepcopy(crd))  # served from its commit on (`_serve_crd`)

    def _serve_crd(self, crd: dict[str, Any]) -> None:
        spec = crd["spec"]
        names = spec["names"]
        for version in spec["versions"]:
            res = (spec["group"], version["name"], names["plural"])
            self.schemas[res] = (version.get("schema") or {}).get("openAPIV3Schema") or {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": True,
            }
            self.add_kind(
                (spec["group"], version["name"], names["plural"]),
                Kind(
                    names["kind"],
                    spec["scope"] == "Namespaced",
                    frozenset(version.get("subresources", {})),
                    frozenset(names.get("shortNames", [])),
                    frozenset(names.get("categories", [])),
                ),
            )

    # -- in-process API ---------------------------------------------------------------------------

    def read_object(self, res: ResKey, namespace: str, name: str) -> dict[str, Any] | None:
        obj = self.store.get((*res, namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def count(self, res: ResKey) -> int:
        """How many objects of a kind there are, without copying them (a benchmark's progress line must not stall
        the server it measures)."""
        return sum(1 for key in self.store if key[:3] == res)

    def objects(self, res: ResKey, namespace: str | None = None, labels: str | None = None) -> list[dict[str, Any]]:
        return [copy.deepcopy(o) for o in self._select(res, namespace, label_matcher(labels), lambda _: True)]

    def create_object(self, res: ResKey, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        kind = self.kinds[res]
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
        name = meta.get("name")
        if not name:
            raise KubeError(422, f"{kind.kind}: metadata.name: Required value")
        ns = (namespace or meta.get("namespace") or "default") if kind.namespaced else ""
        key = (*res, ns, name)
        if key in self.store:
            raise KubeError(409, f'{res[2]} "{name}" already exists', "AlreadyExists")
        if kind.namespaced:
            meta["namespace"] = ns
        meta["uid"] = str(uuid.uuid4())
        meta["generation"] = 1
        meta["creationTimestamp"] = now_rfc3339()
        meta.pop("deletionTimestamp", None)
        obj["apiVersion"] = f"{res[0]}/{res[1]}" if res[0] else res[1]
        obj["kind"] = kind.kind
        if "status" in kind.subresources and res[0] not in ("", "apiextensions.k8s.io"):
            obj.pop("status", None)
        if res == ("", "v1", "pods"):
            obj.setdefault("status", {"phase": "Pending"})
        if res in self.schemas:
            obj = prune(obj, self.schemas[res], root=True)
        for admit in self.admission:
            admit(res, obj)
        self._commit(key, "ADDED", obj)
        self.audit.append(("create", res[2], ns, name))
        if meta.get("ownerReferences"):
            self._collect_soon({key})  # owners that never existed or are gone already
        return copy.deepcopy(obj)

    def set_status(self, res: ResKey, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any] | None:
        """Replace an object's status (what a kubelet or controller does)."""
        key = (*res, namespace, name)
        old = self.store.get(key)
        if old is None:
            return None
        obj = {**old, "status": copy.deepcopy(status)}
        obj["metadata"] = dict(old["metadata"])
        if res in self.schemas:
            obj = prune(obj, self.schemas[res], root=True)
        self._commit(key, "MODIFIED", obj)
        return copy.deepcopy(obj)

    def update_object(
        self, res: ResKey, namespace: str, name: str, change: Callable[[dict[str, Any]], None]
    ) -> dict[str, Any] | None:
        """Change an object in place as a controller's update would (`change` mutates a copy; status kept)."""
        key = (*res, namespace, name)
        old = self.store.get(key)
        if old is None:
            return None
        new = copy.deepcopy(old)
        change(new)
        if res == ("", "v1", "pods"):
            _check_pod_update(old, new)
        self.audit.append(("update", res[2], namespace, name))
        self._commit(key, "MODIFIED", new)
        return copy.deepcopy(new)

    def delete_object(self, res: ResKey, namespace: str, name: str, *, verb: str = "delete") -> dict[str, Any]:
        key = (*res, namespace, name)
        old = self.store.get(key)
        if old is None:
            raise KubeError(404, f'{res[2]} "{name}" not found')
        self.audit.append((verb, res[2], namespace, name))
        if old["metadata"].get("finalizers"):
            if old["metadata"].get("deletionTimestamp"):
                return copy.deepcopy(old)
            obj = copy.deepcopy(old)
            obj["metadata"]["deletionTimestamp"] = now_rfc3339()
            self._commit(key, "MODIFIED", obj)
            return copy.deepcopy(obj)
        self._remove(key)
        return copy.deepcopy(old)

    def _terminating(self, res: ResKey, key: ObjKey, params: Any, options: Any) -> dict[str, Any] | None:
        """A graceful DELETE of a pod no kubelet will confirm (`awaits_kubelet`): the pod as kube-apiserver keeps
        it, Terminating (`deletionTimestamp`: now plus its grace period, `deletionGracePeriodSeconds`); None: delete
        it now."""
        obj = self.store.get(key)
        if res != ("", "v1", "pods") or obj is None or not self.awaits_kubelet(obj):
            return None
        given = params.get("gracePeriodSeconds")
        if given is None and isinstance(options, dict):
            given = options.get("gracePeriodSeconds")
        grace = int(given) if given is not None else int(obj["spec"].get("terminationGracePeriodSeconds", 30))
        if grace == 0:
            return None
        if obj["metadata"].get("deletionTimestamp"):
            return copy.deepcopy(obj)
        held = copy.deepcopy(obj)
        ends = datetime.now(UTC) + timedelta(seconds=grace)
        held["metadata"]["deletionTimestamp"] = ends.strftime("%Y-%m-%dT%H:%M:%SZ")
        held["metadata"]["deletionGracePeriodSeconds"] = grace
        self.audit.append(("delete", res[2], key[3], key[4]))
        self._commit(key, "MODIFIED", held)
        return copy.deepcopy(held)

    def delete_gracefully(self, namespace: str, name: str, grace_s: int) -> dict[str, Any]:
        """A graceful DELETE of a pod that `awaits_kubelet`, as a client sends one: the pod, now Terminating."""
        held = self._terminating(
            ("", "v1", "pods"), ("", "v1", "pods", namespace, name), {"gracePeriodSeconds": grace_s}, None
        )
        assert held is not None, f"pod {name} does not await a kubelet"
        return held

    def bind_pod(self, namespace: str, name: str, node: str) -> None:
        """The scheduler's binding (`pods/binding`): the pod's `spec.nodeName`."""
        key = ("", "v1", "pods", namespace, name)
        obj = self.store.get(key)
        if obj is None or obj["spec"].get("nodeName") == node:
            return
        bound = copy.deepcopy(obj)
        bound["spec"]["nodeName"] = node
        self._commit(key, "MODIFIED", bound)

    # -- state changes ----------------------------------------------------------------------------

    def _commit(self, key: ObjKey, type_: str, obj: dict[str, Any]) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self._unindex(key)
        self.store[key] = obj
        if key[:3] == CRDS:
            self._serve_crd(obj)
        self.uids[obj["metadata"]["uid"]] = key
        for owner in obj["metadata"].get("ownerReferences") or []:
            self.owned.setdefault(owner.get("uid", ""), set()).add(key)
        self._emit(key, type_, obj)

    def _remove(self, key: ObjKey) -> None:
        self._unindex(key)
        obj = copy.deepcopy(self.store.pop(key))
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self._emit(key, "DELETED", obj)
        self._collect_soon(self.owned.pop(obj["metadata"]["uid"], set()))

    def _unindex(self, key: ObjKey) -> None:
        old = self.store.get(key)
        if old is None:
            return
        self.uids.pop(old["metadata"]["uid"], None)
        for owner in old["metadata"].get("ownerReferences") or []:
            self.owned.get(owner.get("uid", ""), set()).discard(key)

    # -- the garbage collector --------------------------------------------------------------------

    def _collect_soon(self, candidates: set[ObjKey]) -> None:
        """The collector runs apart from the request that removed an owner, as the real one does."""
        if not candidates:
            return
        try:
            asyncio.get_running_loop().call_soon(self._collect, candidates)
        except RuntimeError:  # no loop: a test's direct call outside one
            self._collect(candidates)

    def _collect(self, candidates: set[ObjKey]) -> None:
        """Delete each candidate whose owners are all gone (an owner in another namespace never counts: the real
        collector treats such a reference as absent too)."""
        for key in candidates:
            obj = self.store.get(key)
            if obj is None or obj["metadata"].get("deletionTimestamp"):
                continue
            owners = obj["metadata"].get("ownerReferences") or []
            alive = [self.uids.get(o.get("uid", "")) for o in owners]
            if owners and not any(k is not None and k[3] in (key[3], "") for k in alive):
                self.delete_object(key[:3], key[3], key[4], verb="gc-delete")  # type: ignore[arg-type]

    def _emit(self, key: ObjKey, type_: str, obj: dict[str, Any]) -> None:
        res = key[:3]
        self.log.append(Event(self.rv, res, key[3], type_, obj))  # type: ignore[arg-type]
        if len(self.log) > self.max_log:
            cut = len(self.log) // 2
            del self.log[:cut]
            self.log_base += cut
        bell, self.bell = self.bell, asyncio.Event()
        bell.set()
        for listener in list(self.listeners):
            listener(type_, res, obj)  # type: ignore[arg-type]

    def _select(
        self,
        res: ResKey,
        namespace: str | None,
        labels: Callable[[dict[str, str]], bool],
        fields: Callable[[dict[str, Any]], bool],
    ) -> Iterable[dict[str, Any]]:
        for key, obj in self.store.items():
            if key[:3] != res or (namespace is not None and key[3] != namespace):
                continue
            if labels(obj["metadata"].get("labels") or {}) and fields(obj):
                yield obj

    # -- paginated lists (`limit`, `continue`) ------------------------------------------------------

    list_page_cap: int | None = None  # a test's cap on any page: the server may answer fewer items than `limit`

    def _page(self, items: list[dict[str, Any]], params: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """One page of a list, as kube-apiserver serves it: without `limit` and `continue`, every item (in store
        order, as before). With `limit`, the items in key order (namespace, name), at most `limit` of them (and at
        most `list_page_cap` when a test sets one), `metadata.continue` a token for the rest ("" on the last page)
        and `remainingItemCount` how many are left. The token carries the first page's resourceVersion, which every
        page reports; a malformed one answers 400. Unlike kube-apiserver, later pages are read from the current
        store, not from a snapshot at that resourceVersion."""
        limit_text, token = params.get("limit"), params.get("continue")
        if not limit_text and not token:
            return items, {"resourceVersion": str(self.rv), "continue": ""}
        try:
            limit = int(limit_text) if limit_text else 0
            state = json.loads(base64.urlsafe_b64decode(token)) if token else {"rv": self.rv, "after": None}
            rv, after = int(state["rv"]), state["after"]
        except (ValueError, KeyError, TypeError) as exc:
            raise KubeError(400, f"invalid limit or continue parameter: {exc}", "BadRequest") from None
        key = lambda o: [o["metadata"].get("namespace", ""), o["metadata"]["name"]]  # noqa: E731
        rest = sorted((o for o in items if after is None or key(o) > after), key=key)
        size = min(n for n in (limit, self.list_page_cap, len(rest)) if n) if rest else 0
        page, left = rest[:size], rest[size:]
        meta: dict[str, Any] = {"resourceVersion": str(rv), "continue": ""}
        if left:
            meta["continue"] = base64.urlsafe_b64encode(
                json.dumps({"rv": rv, "after": key(page[-1])}).encode()
            ).decode()
            meta["remainingItemCount"] = len(left)
        self.request_counts["list-page"] += 1
        return page, meta

    # -- HTTP ---------------------------------------------------------------------------------------

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        watch = raw_request.query.get("watch") in ("true", "1")
        verb = "watch" if watch else raw_request.method.lower()
        self.request_counts[verb] += 1
        if (hang := self._hung(raw_request.path)) is not None:
            return await hang.hold()
        if raw_request.path.rstrip("/") == "/api/v1/namespaces":
            return await self._namespaces(raw_request)
        response = await super().__call__(raw_request)
        if not self.keep_requests:
            self._requests.clear()
        return response

    def _hung(self, path: str) -> Hang | None:
        """The hang (`hang`) that holds a request for `path` arriving now, if any."""
        return next((h for h in self.hangs if h.on and h.matches(path)), None)

    async def _namespaces(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """`GET /api/v1/namespaces`, which kmock's path parser cannot take (it reads "namespaces" as the start of a
        namespaced path): every namespace that holds an object, plus default and kube-system. kopf lists them
        when it watches given namespaces. A watch stays open, silent, until its timeout: namespaces never change
        in these tests."""
        if raw_request.query.get("watch") in ("true", "1"):
            response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
            await response.prepare(raw_request)
            await asyncio.sleep(float(raw_request.query.get("timeoutSeconds") or 60))
            await response.write_eof()
            return response
        names = sorted({key[3] for key in self.store if key[3]} | {"default", "kube-system"})
        items = [
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": n, "labels": {"kubernetes.io/metadata.name": n}},
                "status": {"phase": "Active"},
            }
            for n in names
        ]
        body = {
            "apiVersion": "v1",
            "kind": "NamespaceList",
            "metadata": {"resourceVersion": str(self.rv)},
            "items": items,
        }
        return aiohttp.web.json_response(body)

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        res = request.resource
        if res is None or not res.plural or res.version is None or res.group is None:
            return await super()._handle(request)
        key: ResKey = (res.group, res.version, res.plural)
        if key not in self.kinds:
            return self._error(KubeError(404, f"the server could not find the requested resource ({res.plural})"))
        try:
            if (reacted := await self._react(request)) is not None:
                return reacted
            return await self._serve(request, key)
        except KubeError as exc:
            return self._error(exc)
        except ValueError as exc:  # bad selectors
            return self._error(KubeError(400, str(exc)))

    async def _react(self, request: kmock.Request) -> aiohttp.web.StreamResponse | None:
        """The first of the test's own kmock reactions that matches and answers (see the module docstring)."""
        for reaction in list(self._payloads):
            if -math.inf in reaction.priorities or reaction._disabled.is_set():
                continue  # the scaffold's fallbacks (discovery, errors), or a retired reaction
            if request in reaction._source:
                try:
                    return await reaction(request)
                except kmock.ReactionMismatchError:  # depleted: let the request through from now on
                    reaction._disabled.set()
                except NotImplementedError:
                    pass
        return None

    def _error(self, exc: KubeError) -> aiohttp.web.Response:
        body = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": str(exc),
            "reason": exc.reason,
            "code": exc.code,
        }
        return aiohttp.web.json_response(body, status=exc.code)

    async def _serve(self, request: kmock.Request, res: ResKey) -> aiohttp.web.StreamResponse:
        kind = self.kinds[res]
        method = request.method.value
        params = request.params
        ns = (request.namespace or "") if kind.namespaced else ""
        name, sub = request.name, request.subresource
        if sub is not None and sub not in kind.subresources:
            raise KubeError(404, f"{res[2]}/{sub}: no such subresource")
        if method == "GET" and params.get("watch", "").lower() in ("true", "1"):
            return await self._watch(request, res, request.namespace if kind.namespaced else None)
        if method == "GET" and name is None:
            items = self._select(
                res,
                request.namespace if kind.namespaced else None,
                label_matcher(params.get("labelSelector")),
                field_matcher(params.get("fieldSelector")),
            )
            page, list_meta = self._page(list(items), params)
            return aiohttp.web.json_response(
                {
                    "apiVersion": f"{res[0]}/{res[1]}" if res[0] else res[1],
                    "kind": f"{kind.kind}List",
                    "metadata": list_meta,
                    "items": page,
                }
            )
        if method == "POST" and name is None:
            if not isinstance(request.data, dict):
                raise KubeError(400, "the request body is not an object")
            return aiohttp.web.json_response(self.create_object(res, ns, request.data), status=201)
        if name is None:
            raise KubeError(405, f"{method} on a collection of {res[2]} is not supported here")
        key = (*res, ns, name)
        if method == "GET":
            obj = self.store.get(key)
            if obj is None:
                raise KubeError(404, f'{res[2]} "{name}" not found')
            return aiohttp.web.json_response(obj)
        if method == "DELETE":
            _check_preconditions(request.data, self.store.get(key))
            held = self._terminating(res, key, params, request.data)
            if held is not None:
                return aiohttp.web.json_response(held)
            return aiohttp.web.json_response(self.delete_object(res, ns, name))
        if method == "PATCH" and _content_type(request) == APPLY and key not in self.store and sub is None:
            return aiohttp.web.json_response(self.create_object(res, ns, _applied(request, res, name)), status=201)
        if method in ("PATCH", "PUT"):
            return aiohttp.web.json_response(self._update(request, res, kind, key, sub))
        raise KubeError(405, f"{method} is not supported")

    def _update(self, request: kmock.Request, res: ResKey, kind: Kind, key: ObjKey, sub: str | None) -> dict[str, Any]:
        old = self.store.get(key)
        if old is None:
            raise KubeError(404, f'{res[2]} "{key[4]}" not found')
        body = request.data
        ctype = _content_type(request)
        if request.method.value == "PUT":
            if not isinstance(body, dict):
                raise KubeError(400, "the request body is not an object")
            sent_rv = (body.get("metadata") or {}).get("resourceVersion")
            if sent_rv and sent_rv != old["metadata"]["resourceVersion"]:
                raise KubeError(409, "the object has been modified; please apply your changes to the latest version")
            new = copy.deepcopy(body)
        elif ctype == "application/json-patch+json":
            if not isinstance(body, list):
                raise KubeError(400, "a JSON patch is a list of operations")
            try:
                new = jsonpatch.apply_patch(copy.deepcopy(old), body)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
                raise KubeError(422, f"the patch cannot be applied: {exc}") from None
        elif ctype == "application/strategic-merge-patch+json" and res in self.schemas:
            raise KubeError(
                415,
                f"the body of the request was in an unknown format - accepted media types include: "
                f"application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml "
                f"({res[2]}.{res[0]} is a custom resource)",
                "UnsupportedMediaType",
            )
        elif ctype == APPLY:
            new = merge_patch(old, _applied(request, res, key[4]))
        elif ctype in ("application/merge-patch+json", "application/strategic-merge-patch+json", "application/json"):
            if not isinstance(body, dict):
                raise KubeError(400, "a merge patch is an object")
            sent_rv = (body.get("metadata") or {}).get("resourceVersion")
            if sent_rv and sent_rv != old["metadata"]["resourceVersion"]:
                raise KubeError(409, "the object has been modified; please apply your changes to the latest version")
            new = merge_patch(old, body)
        else:
            raise KubeError(415, f"unsupported patch type {ctype!r}")
        if sub == "status":
            new = {**old, "status": new.get("status")}
        elif "status" in kind.subresources:
            new = {k: v for k, v in new.items() if k != "status"}
            if "status" in old:
                new["status"] = old["status"]
        meta = dict(new.get("metadata") or {})
        for fixed in ("uid", "name", "namespace", "creationTimestamp", "deletionTimestamp", "generation"):
            if fixed in old["metadata"]:
                meta[fixed] = old["metadata"][fixed]
            else:
                meta.pop(fixed, None)
        new["metadata"] = meta
        new["apiVersion"], new["kind"] = old["apiVersion"], old["kind"]
        if res in self.schemas:
            new = prune(new, self.schemas[res], root=True)
            meta = new["metadata"]
        if res == ("", "v1", "pods"):
            _check_pod_update(old, new)
        if {k: v for k, v in new.items() if k not in ("metadata", "status")} != {
            k: v for k, v in old.items() if k not in ("metadata", "status")
        }:
            meta["generation"] = int(old["metadata"].get("generation", 1)) + 1
        if new == old:
            return copy.deepcopy(old)
        self.audit.append(("update" if sub is None else f"update/{sub}", res[2], key[3], key[4]))
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            self._commit(key, "MODIFIED", new)
            self._remove(key)
            return copy.deepcopy(new)
        self._commit(key, "MODIFIED", new)
        return copy.deepcopy(new)

    async def _watch(self, request: kmock.Request, res: ResKey, namespace: str | None) -> aiohttp.web.StreamResponse:
        params = request.params
        labels = label_matcher(params.get("labelSelector"))
        fields = field_matcher(params.get("fieldSelector"))
        timeout = float(params.get("timeoutSeconds") or 0) or None
        bookmarks = params.get("allowWatchBookmarks", "").lower() == "true"
        since_text = params.get("resourceVersion") or ""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout if timeout else None
        assert request._raw_request is not None
        resp = aiohttp.web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        await resp.prepare(request._raw_request)  # type: ignore[arg-type]
        kind = self.kinds[res]
        api_version = f"{res[0]}/{res[1]}" if res[0] else res[1]
        epoch = self.watch_epoch

        async def send(event: dict[str, Any]) -> None:
            await resp.write(json.dumps(event).encode() + b"\n")

        try:
            if since_text in ("", "0"):
                since = self.rv
                for obj in list(self._select(res, namespace, labels, fields)):
                    await send({"type": "ADDED", "object": obj})
            else:
                since = int(since_text)
                if since < self.expired_rv:
                    await send(_gone(since))
                    return resp
            if self.log_base and self.log and since < self.log[0].rv - 1:
                await send(_gone(since))  # the log no longer holds what came right after `since`
                return resp
            pos = bisect.bisect_right([e.rv for e in self.log], since) + self.log_base
            while not self.closing:
                if pos < self.log_base or epoch != self.watch_epoch:
                    await send(_gone(since))
                    return resp
                while pos - self.log_base < len(self.log):
                    event = self.log[pos - self.log_base]
                    pos += 1
                    since = event.rv
                    if event.res != res or (namespace is not None and event.namespace != namespace):
                        continue
                    if labels(event.obj["metadata"].get("labels") or {}) and fields(event.obj):
                        await resp.write(event.line)
                wait = self.bookmark_s
                if deadline is not None:
                    wait = min(wait, deadline - loop.time())
                    if wait <= 0:
                        return resp
                bell = self.bell
                try:
                    await asyncio.wait_for(bell.wait(), wait)
                except TimeoutError:
                    if bookmarks:
                        meta = {"resourceVersion": str(self.rv)}
                        await send(
                            {
                                "type": "BOOKMARK",
                                "object": {"kind": kind.kind, "apiVersion": api_version, "metadata": meta},
                            }
                        )
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            return resp
        return resp


def _content_type(request: kmock.Request) -> str:
    return (request.headers.get("Content-Type") or "").split(";")[0].strip()


def _applied(request: kmock.Request, res: ResKey, name: str) -> dict[str, Any]:
    """The object of a server-side apply request, refused as kube-apiserver refuses it."""
    if not request.params.get("fieldManager"):
        raise KubeError(400, "PATCH with apply requires a fieldManager", "BadRequest")
    try:
        body = yaml.safe_load(request.text)
    except yaml.YAMLError as exc:
        raise KubeError(400, f"the body of an apply request is not YAML: {exc}", "BadRequest") from None
    if not isinstance(body, dict) or not body.get("apiVersion") or not body.get("kind"):
        raise KubeError(400, "an applied object needs apiVersion and kind", "BadRequest")
    if (body.get("metadata") or {}).get("name") != name:
        raise KubeError(400, f"the name of the object ({body.get('metadata', {}).get('name')}) does not match the "
                        f"name on the URL ({name})", "BadRequest")  # fmt: skip
    if body["apiVersion"] != (f"{res[0]}/{res[1]}" if res[0] else res[1]):
        raise KubeError(400, f"apiVersion {body['apiVersion']} does not match the URL's", "BadRequest")
    return body


def _gone(since: int) -> dict[str, Any]:
    return {
        "type": "ERROR",
        "object": {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": f"too old resource version: {since}",
            "reason": "Expired",
            "code": 410,
        },
    }


def _check_preconditions(options: Any, obj: dict[str, Any] | None) -> None:
    """A DELETE's `DeleteOptions.preconditions` (uid, resourceVersion): 409 when the object is another, as
    kube-apiserver answers."""
    preconditions = (options or {}).get("preconditions") if isinstance(options, dict) else None
    if not preconditions or obj is None:
        return
    meta = obj["metadata"]
    for field in ("uid", "resourceVersion"):
        wanted = preconditions.get(field)
        if wanted is not None and wanted != meta.get(field):
            raise KubeError(
                409,
                f"Precondition failed: {field} in precondition: {wanted}, {field} in object meta: {meta.get(field)}",
            )


def _check_pod_update(old: dict[str, Any], new: dict[str, Any]) -> None:
    """kube-apiserver's pod update validation, where tests depend on it: scheduling gates can only be removed."""
    before = [g.get("name") for g in (old.get("spec") or {}).get("schedulingGates") or []]
    after = [g.get("name") for g in (new.get("spec") or {}).get("schedulingGates") or []]
    if any(gate not in before for gate in after):
        raise KubeError(422, "spec.schedulingGates: Forbidden: only deletion is allowed, but found new scheduling gate")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


# -- CRDs older than the operator -------------------------------------------------------------------------------

# The Run status fields an older chart's CRD lacks (added since: the grading report, the GPU ledger's pod times, the
# Gaia2 world's verdict, the gateways' spend).
OLD_RUN_STATUS = ("report", "podTimes", "worldVerdict", "clusterSpend", "budgetStop")


def older_crd(crd: dict[str, Any], status_without: Iterable[str]) -> dict[str, Any]:
    """`crd` as an older labkube generated it: without the status fields `status_without`."""
    old = copy.deepcopy(crd)
    status = old["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    for name in status_without:
        del status["properties"][name]
    return old


def serve_older_crds(api: FakeKube, run_status_without: Iterable[str] = OLD_RUN_STATUS) -> dict[str, Any]:
    """What `helm upgrade` leaves in a cluster installed by an older chart (Helm never upgrades CRDs): the Run CRD
    without `run_status_without`. From then on the server prunes those fields from every write of a Run, its status
    patches included, and answers 200 with what it stored, as kube-apiserver does with a structural schema. Returns
    the CRD as stored."""
    old = older_crd(run_crd(), run_status_without)
    changed = api.update_object(CRDS, "", run_crd()["metadata"]["name"], lambda crd: crd.update(spec=old["spec"]))
    assert changed is not None
    return changed


# -- transient refusals (issue 42, "transient is not final") -------------------------------------------------------


class QuotaRefusal:
    """A kmock reaction (`api[kmock.action.CREATE, kmock.resource("v1/pods")] << QuotaRefusal(60)`): every create it
    sees for `seconds` answers as kube-apiserver's ResourceQuota admission does when a namespace's quota is full: 403
    Forbidden, reason `Forbidden`, message `pods "NAME" is forbidden: exceeded quota: ...`; then it retires and the
    creates go through (the pods that held the quota ended)."""

    def __init__(self, seconds: float, quota: str = "gpu-quota", resource: str = "requests.nvidia.com/gpu") -> None:
        self.until = time.monotonic() + seconds
        self.quota, self.resource = quota, resource
        self.hits: list[str] = []  # the names refused

    def __call__(self, request: kmock.Request) -> Any:
        if time.monotonic() >= self.until:
            return NotImplemented
        body = request.data if isinstance(request.data, dict) else {}
        name = (body.get("metadata") or {}).get("name") or "?"
        self.hits.append(name)
        plural = request.resource.plural if request.resource is not None else "pods"
        raise KubeError(
            403,
            f'{plural} "{name}" is forbidden: exceeded quota: {self.quota}, requested: {self.resource}=1, '
            f"used: {self.resource}=2, limited: {self.resource}=2",
            "Forbidden",
        )


class Throttle:
    """A kmock reaction: the first `times` requests it sees answer 429 Too Many Requests with a `Retry-After` header
    of `retry_after` seconds (API Priority and Fairness rejecting a request), then it retires. `answered_at` holds
    when each 429 was sent, `passed_at` when the first request after them came (a client that honours
    Retry-After comes back no sooner than it asks)."""

    def __init__(self, times: int, retry_after: int = 2) -> None:
        self.left, self.retry_after = times, retry_after
        self.answered_at: list[float] = []
        self.passed_at: float | None = None

    def __call__(self, request: kmock.Request) -> Any:
        if self.left == 0:
            self.passed_at = self.passed_at or time.monotonic()
            return NotImplemented
        self.left -= 1
        self.answered_at.append(time.monotonic())
        status = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": "Too many requests, please try again later.",
            "reason": "TooManyRequests",
            "details": {"retryAfterSeconds": self.retry_after},
            "code": 429,
        }
        return kmock.Response(status=429, headers={"Retry-After": str(self.retry_after)}, payload=status)
