"""Gaia2 bugs from issue #18: unknown scenario references fail before anything runs, and variadic
parameters of ARE app tools (`**kwargs`) are not required schema fields."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from cli_helpers import labkube

from labkube.agent.rg.world_session import WorldSession, world_tool
from labkube.tasks import TaskError, resolve_tasks
from labkube.tasks.gaia2 import WorldClient, setup_world_env, start_world, world_python
from labkube.tasks.gaia2.scenarios import ARE_REGISTRY_SCENARIOS

MKDIR = "SandboxLocalFileSystem__mkdir"


def test_unknown_gaia2_scenario_is_refused_before_anything_runs(tmp_path: Path):
    ran = labkube("run", "gaia2/no_such_scenario", "--model", "oracle", "--out", "camp", cwd=tmp_path, timeout=120)
    assert ran.returncode == 2, ran.stderr
    lines = ran.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown Gaia2 scenario 'gaia2/no_such_scenario'" in lines[0], ran.stderr
    assert not (tmp_path / "camp").exists() and not (tmp_path / "campaigns").exists()


def test_are_registry_scenario_still_resolves():
    (card,) = resolve_tasks("gaia2/scenario_tutorial")
    assert card.gaia2 is not None and card.gaia2.source == "scenario_tutorial"
    with pytest.raises(TaskError, match="not in ARE's registry"):
        resolve_tasks("gaia2/scenario_tutorialz")


@pytest.mark.gaia2
def test_registry_list_matches_the_installed_are():
    setup_world_env()
    site = world_python().parent.parent / "lib"
    found = {
        m
        for path in site.glob("python*/site-packages/are/simulation/scenarios/*/scenario.py")
        for m in re.findall(r'@register_scenario\("([^"]+)"\)', path.read_text(encoding="utf-8"))
    }
    assert found == set(ARE_REGISTRY_SCENARIOS)


@pytest.fixture(scope="module")
def world():
    setup_world_env()
    process = start_world(world_python())
    yield process
    process.stop()


@pytest.mark.gaia2
async def test_kwargs_of_an_are_tool_are_not_a_required_field(world):
    async with world.client() as client:
        client: WorldClient
        await client.load_scenario("scenario_find_image_file")
        spec = {t.name: t for t in await client.list_tools()}[MKDIR]
        assert spec.parameters["required"] == ["path"]
        assert "kwargs" not in spec.parameters["properties"]
        assert "create_parents" in spec.parameters["properties"]


@pytest.mark.gaia2
async def test_mkdir_with_only_a_path_works_through_the_agents_tool(world):
    async with world.client() as client:
        await client.load_scenario("scenario_find_image_file")
        spec = {t.name: t for t in await client.list_tools()}[MKDIR]
        tool = world_tool(WorldSession(client), spec, SimpleNamespace(ended=False))
        await tool({"path": "/exports_test_dir"})  # raised "missing required argument(s) kwargs" before
        listing = await client.call_tool("SandboxLocalFileSystem__ls", {"path": "/"})
        assert listing.ok and "exports_test_dir" in listing.text, listing
