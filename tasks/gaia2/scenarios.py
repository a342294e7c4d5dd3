"""Scenario references: what a user types, turned into what a world process can load.

    gaia2/<name>             a bundled scenario (tasks/bundled/gaia2/<name>.json), else an id in ARE's registry
    gaia2                    every bundled scenario
    path/to/scenario.json    an ARE scenario JSON file (a Gaia2 row's `data`, an exported trace)
    path/to/rows.jsonl       Gaia2 dataset rows: {"scenario_id": ..., "data": <JSON text>} per line
                             (ARE's own {"trace_id": <path to a .json>} rows work too)
    path/to/dataset/         every .json and .jsonl below it; a folder named like a capability
                             (execution/, search/, ...) tags what is inside, as the hub's configs do
    <any of these>#<id>      only the scenario with that scenario_id

The world process reads JSON itself; here we only read enough to name scenarios and tag capabilities.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

CAPABILITIES = ("execution", "search", "adaptability", "time", "ambiguity", "agent2agent", "noise")
BUNDLED_DIR = Path(__file__).resolve().parent.parent / "bundled" / "gaia2"
TRACE_VERSION = "are_simulation_v1"
# The scenarios ARE's registry holds in the pinned version (world_env.ARE_VERSION): `gaia2/<id>` resolves
# against this list before anything runs (tests/test_gaia2_bugs.py checks it against the installed ARE).
ARE_REGISTRY_SCENARIOS = (
    "scenario_apps_tutorial",
    "scenario_events_tutorial",
    "scenario_find_image_file",
    "scenario_hf_demo_mcp",
    "scenario_mcp_demo",
    "scenario_tutorial",
    "scenario_validation_tutorial",
)


class ScenarioError(ValueError):
    """A scenario reference that names nothing loadable."""


class Gaia2Scenario(BaseModel):
    """One scenario: `source` is what `POST /scenario` takes (a registry id, a file path or JSON text)."""

    model_config = ConfigDict(frozen=True)

    ref: str
    scenario_id: str
    source: str
    capabilities: tuple[str, ...] = ()

    @property
    def is_registry(self) -> bool:
        return not self.source.lstrip().startswith("{") and not self.source.endswith(".json")


def capability_tags(data: Mapping[str, Any], config: str | None = None) -> tuple[str, ...]:
    """Capabilities of a scenario from its metadata (tags, config, augmentation flags) and, for dataset
    rows, the config (folder or column) it came from."""
    definition = (data.get("metadata") or {}).get("definition") or {}
    found = {str(t).lower() for t in definition.get("tags") or []}
    for name in (definition.get("config"), config):
        if name:
            found.add(str(name).lower())
    if definition.get("has_a2a_augmentation"):
        found.add("agent2agent")
    if definition.get("has_tool_augmentation") or definition.get("has_env_events_augmentation"):
        found.add("noise")
    return tuple(c for c in CAPABILITIES if c in found)


def _parse(text: str, where: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ScenarioError(f"{where}: not JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("version") != TRACE_VERSION:
        raise ScenarioError(f'{where}: not an ARE scenario (expected "version": "{TRACE_VERSION}")')
    return data


def _scenario_id(data: Mapping[str, Any], where: str) -> str:
    scenario_id = ((data.get("metadata") or {}).get("definition") or {}).get("scenario_id")
    if not scenario_id:
        raise ScenarioError(f"{where}: no metadata.definition.scenario_id")
    return str(scenario_id)


def _from_file(path: Path, ref: str, config: str | None = None) -> Gaia2Scenario:
    data = _parse(path.read_text(encoding="utf-8"), str(path))
    return Gaia2Scenario(
        ref=ref, scenario_id=_scenario_id(data, str(path)), source=str(path), capabilities=capability_tags(data, config)
    )


def _from_rows(path: Path, config: str | None = None) -> Iterable[Gaia2Scenario]:
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise ScenarioError(f"{where}: not JSON ({exc})") from None
        if "trace_id" in row and "data" not in row:
            trace = Path(row["trace_id"])
            trace = trace if trace.is_absolute() else path.parent / trace
            scenario = _from_file(trace, str(trace), config)
            yield scenario
            continue
        payload = row.get("data")
        if payload is None:
            raise ScenarioError(f"{where}: a Gaia2 row needs a data column (the scenario JSON)")
        text = payload if isinstance(payload, str) else json.dumps(payload)
        data = _parse(text, where)
        scenario_id = str(row.get("scenario_id") or _scenario_id(data, where))
        row_config = row.get("config") or row.get("category") or config
        yield Gaia2Scenario(
            ref=f"{path}#{scenario_id}",
            scenario_id=scenario_id,
            source=text,
            capabilities=capability_tags(data, row_config),
        )


def _from_dir(root: Path) -> Iterable[Gaia2Scenario]:
    for path in sorted(root.rglob("*")):
        if path.suffix not in (".json", ".jsonl") or not path.is_file():
            continue
        folders = [p.lower() for p in path.relative_to(root).parts[:-1]]
        config = next((f for f in reversed(folders) if f in CAPABILITIES), None)
        if path.suffix == ".jsonl":
            yield from _from_rows(path, config)
        else:
            yield _from_file(path, str(path), config)


def bundled_scenarios() -> list[str]:
    """References of the scenarios shipped with labkube, as `gaia2/<name>`."""
    return [f"gaia2/{p.stem}" for p in sorted(BUNDLED_DIR.glob("*.json"))]


def resolve_scenarios(ref: str) -> list[Gaia2Scenario]:
    """Every scenario a reference names (see the module docstring)."""
    target, _, wanted = ref.partition("#")
    path = Path(target).expanduser()
    if target.rstrip("/") == "gaia2":
        found = [_from_file(BUNDLED_DIR / f"{r.split('/', 1)[1]}.json", r) for r in bundled_scenarios()]
    elif target.startswith("gaia2/") and not path.exists():
        name = target.split("/", 1)[1]
        bundled = BUNDLED_DIR / f"{name}.json"
        if bundled.is_file():
            found = [_from_file(bundled, target)]
        elif name in ARE_REGISTRY_SCENARIOS:
            found = [Gaia2Scenario(ref=target, scenario_id=name, source=name)]
        else:
            names = [*bundled_scenarios(), *(f"gaia2/{n}" for n in ARE_REGISTRY_SCENARIOS)]
            near = difflib.get_close_matches(target, names, n=1)
            hint = f"did you mean {near[0]}?" if near else ", ".join(names)
            raise ScenarioError(f"unknown Gaia2 scenario {target!r}: not bundled and not in ARE's registry ({hint})")
    elif path.is_dir():
        found = list(_from_dir(path))
    elif path.is_file() and path.suffix == ".jsonl":
        found = list(_from_rows(path))
    elif path.is_file():
        found = [_from_file(path, target)]
    else:
        bundled = ", ".join(bundled_scenarios()) or "none"
        raise ScenarioError(
            f"unknown Gaia2 scenario {ref!r}: not a file or folder, and not gaia2/<name> (bundled: {bundled})"
        )
    if wanted:
        found = [s for s in found if s.scenario_id == wanted]
        if not found:
            raise ScenarioError(f"{target}: no scenario with scenario_id {wanted!r}")
        found = [s.model_copy(update={"ref": ref}) for s in found]
    if not found:
        raise ScenarioError(f"{ref}: no scenarios found (expected .json files or .jsonl rows)")
    return found


def load_scenario(ref: str) -> Gaia2Scenario:
    """Exactly one scenario."""
    found = resolve_scenarios(ref)
    if len(found) != 1:
        raise ScenarioError(f"{ref!r} names {len(found)} scenarios; name one, e.g. {found[0].ref}")
    return found[0]
