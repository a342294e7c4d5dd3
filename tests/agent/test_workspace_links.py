"""rg-agent's file tools never leave the workspace through a symbolic link, nor through a race that swaps a
directory for one: every path is walked by file descriptor from the root, no link followed (agent/rg/workspace.py).

The layout: runs/run-a/ws is the workspace; runs/run-b/ws is another run's; secret.txt and outside/ lie outside
both. Every test compares everything outside the workspace, byte for byte, before and after."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from labkube.agent.jobs import JobManager
from labkube.agent.rg.apply_patch import PatchError, apply_patch
from labkube.agent.rg.tool import Tool, ToolError
from labkube.agent.rg.tools import ToolContext, research_tools
from labkube.agent.rg.workspace import PathError, Workspace

SECRET = "outside-secret-3f9c"


class Layout:
    def __init__(self, base: Path) -> None:
        self.base = base.resolve()
        self.run = self.base / "runs" / "run-a"
        self.ws = self.run / "ws"
        self.sibling = self.base / "runs" / "run-b" / "ws"
        (self.ws / "sub").mkdir(parents=True)
        self.sibling.mkdir(parents=True)
        (self.base / "outside").mkdir()
        (self.ws / "notes.txt").write_text("inside notes\nsecond line\n")
        (self.ws / "sub" / "x.py").write_text("x = 1\n")
        (self.base / "secret.txt").write_text(f"{SECRET}\n")
        (self.base / "outside" / "inner.txt").write_text(f"{SECRET} inner\n")
        (self.sibling / "results.txt").write_text(f"{SECRET} sibling\n")
        (self.run / "result.json").write_text(f'{{"score": "{SECRET}"}}\n')
        os.symlink(self.base / "secret.txt", self.ws / "link_file")  # to a file outside
        os.symlink(self.base / "outside", self.ws / "link_dir")  # a directory outside
        os.symlink("../../run-b/ws", self.ws / "link_sibling")  # another run's workspace
        os.symlink("..", self.ws / "link_up")  # the run folder above the workspace
        os.symlink(self.base / "outside" / "new.txt", self.ws / "dangling")  # a file not made yet
        os.symlink("../notes.txt", self.ws / "sub" / "inner_link")  # a link that stays inside
        self.ctx = ToolContext(workspace=Workspace(self.ws), jobs=JobManager(self.base / "jobs"))
        self.tools: dict[str, Tool] = {t.name: t for t in research_tools(self.ctx)}

    def outside(self) -> dict[str, tuple[str, bytes | str | None]]:
        """Every entry under the base except the workspace and the job logs: its kind and content."""
        out: dict[str, tuple[str, bytes | str | None]] = {}
        for p in sorted(self.base.rglob("*")):
            rel = p.relative_to(self.base).as_posix()
            if rel.startswith(("runs/run-a/ws/", "jobs")) or rel == "runs/run-a/ws":
                continue
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_file():
                out[rel] = ("file", p.read_bytes())
            else:
                out[rel] = ("dir", None)
        return out

    async def call(self, name: str, args: dict[str, Any]) -> str:
        return await self.tools[name](args)


@pytest.fixture
def lay(tmp_path: Path) -> Layout:
    return Layout(tmp_path)


def patch(*lines: str) -> dict[str, str]:
    return {"patch": "\n".join(["*** Begin Patch", *lines, "*** End Patch"])}


# Paths through a link: to a file outside, through a directory outside, into another run, up to the run folder,
# a dangling link to a file outside, and a link that stays inside (refused all the same: links are not followed).
LINKED = [
    "link_file",
    "link_dir/inner.txt",
    "link_sibling/results.txt",
    "link_up/result.json",
    "dangling",
    "sub/inner_link",
]
NEW_THROUGH_LINK = ["link_dir/new.txt", "link_sibling/new.txt", "link_up/new.txt", "dangling"]


def calls_on(path: str) -> list[tuple[str, dict[str, Any]]]:
    return [
        ("read_file", {"path": path}),
        ("search_file", {"path": path, "query": "secret"}),
        ("search", {"pattern": ".", "path": path}),
        ("write_file", {"path": path, "content": "overwritten\n"}),
        ("replace", {"path": path, "old_string": SECRET, "new_string": "overwritten"}),
        ("replace", {"path": path, "old_string": "", "new_string": "created\n"}),
        ("apply_patch", patch(f"*** Update File: {path}", "@@", f"-{SECRET}", "+overwritten")),
        ("apply_patch", patch(f"*** Update File: {path}", f"*** Move to: moved-{len(path)}.txt")),
        ("apply_patch", patch(f"*** Add File: {path}", "+created")),
        ("apply_patch", patch(f"*** Delete File: {path}")),
        ("apply_patch", patch("*** Update File: notes.txt", f"*** Move to: {path}")),
    ]


CASES = [(name, args) for path in LINKED for name, args in calls_on(path)] + [
    (name, args) for path in NEW_THROUGH_LINK for name, args in calls_on(path) if name in ("write_file", "replace")
]


def case_id(value: Any) -> str:
    if isinstance(value, dict):
        text = value.get("path") or value.get("patch", "").split("\n")[1]
        return f"{text}|{value.get('old_string', '')[:4]}"
    return str(value)


@pytest.mark.parametrize(("name", "args"), CASES, ids=case_id)
async def test_a_link_given_to_a_file_tool_is_refused_and_nothing_outside_changes(
    lay: Layout, name: str, args: dict[str, Any]
) -> None:
    before, inside_before = lay.outside(), (lay.ws / "notes.txt").read_bytes()
    with pytest.raises(ToolError) as refused:
        await lay.call(name, args)
    message = str(refused.value)
    assert "symbolic link" in message and "do not follow links" in message, message
    assert SECRET not in message and "\n" not in message.strip()
    assert lay.outside() == before, "something outside the workspace changed"
    assert (lay.ws / "notes.txt").read_bytes() == inside_before
    assert not any(p.name.startswith("moved-") for p in lay.ws.iterdir())


async def test_the_refusal_is_one_short_line_naming_the_link(lay: Layout) -> None:
    with pytest.raises(ToolError) as whole:
        await lay.call("read_file", {"path": "sub/inner_link"})
    assert str(whole.value) == (
        "sub/inner_link is a symbolic link; the file tools do not follow links (use bash inside your workspace)"
    )
    with pytest.raises(ToolError) as part:
        await lay.call("write_file", {"path": "link_sibling/deep/new.txt", "content": "x"})
    assert str(part.value) == (
        "link_sibling/deep/new.txt: link_sibling is a symbolic link leading outside the workspace; "
        "the file tools do not follow links (use bash inside your workspace)"
    )
    with pytest.raises(ToolError) as patched:
        await lay.call("apply_patch", patch("*** Delete File: link_file"))
    assert str(patched.value) == (
        "patch not applied: Delete File link_file: link_file is a symbolic link leading outside the workspace; "
        "the file tools do not follow links (use bash inside your workspace)"
    )


async def test_search_of_the_workspace_passes_links_over(lay: Layout) -> None:
    out = await lay.call("search", {"pattern": "."})
    assert SECRET not in out
    assert out.splitlines() == ["notes.txt:1: inside notes", "notes.txt:2: second line", "sub/x.py:1: x = 1"]
    assert await lay.call("search", {"pattern": "x", "path": "sub"}) == "sub/x.py:1: x = 1"


async def test_plain_files_inside_still_work(lay: Layout) -> None:
    assert (await lay.call("read_file", {"path": "notes.txt"})).startswith("notes.txt: 2 lines")
    assert "[match 1 of 1, line 2]" in await lay.call("search_file", {"path": "./notes.txt", "query": "SECOND"})
    assert (
        await lay.call("write_file", {"path": "new/deep/a.txt", "content": "a\n"}) == "created new/deep/a.txt (2 bytes)"
    )
    assert await lay.call("write_file", {"path": "sub/../new/deep/a.txt", "content": "bb\n"}) == (
        "overwrote new/deep/a.txt (3 bytes)"
    )
    assert await lay.call("replace", {"path": "notes.txt", "old_string": "second", "new_string": "2nd"}) == (
        "replaced 1 occurrence in notes.txt (at line 2)"
    )
    assert await lay.call("replace", {"path": "r/n.py", "old_string": "", "new_string": "n\n"}) == (
        "created r/n.py (2 bytes)"
    )
    out = await lay.call(
        "apply_patch",
        patch(
            "*** Add File: p/added.txt",
            "+added",
            "*** Update File: sub/x.py",
            "*** Move to: sub/y.py",
            "@@",
            "-x = 1",
            "+x = 2",
            "*** Delete File: new/deep/a.txt",
        ),
    )
    assert out == "Patch applied: added p/added.txt; deleted new/deep/a.txt; moved sub/x.py -> sub/y.py"
    assert (lay.ws / "notes.txt").read_text() == "inside notes\n2nd line\n"
    assert (lay.ws / "p" / "added.txt").read_text() == "added\n"
    assert (lay.ws / "sub" / "y.py").read_text() == "x = 2\n" and not (lay.ws / "sub" / "x.py").exists()
    assert (lay.ws / "r" / "n.py").read_text() == "n\n"
    absolute = str(lay.ws / "notes.txt")
    assert (await lay.call("read_file", {"path": absolute})).startswith("notes.txt: 2 lines")


async def test_escapes_without_links_keep_their_messages(lay: Layout) -> None:
    for path in ("../result.json", "sub/../../result.json", str(lay.base / "secret.txt"), str(lay.run)):
        with pytest.raises(ToolError, match="outside the workspace"):
            await lay.call("read_file", {"path": path})
    with pytest.raises(ToolError, match="no such file or directory"):
        await lay.call("read_file", {"path": "missing/x.txt"})
    with pytest.raises(ToolError, match=r"^notes\.txt/x: notes\.txt is not a directory$"):
        await lay.call("write_file", {"path": "notes.txt/x", "content": "x"})
    with pytest.raises(ToolError, match=r"^sub is a directory$"):
        await lay.call("write_file", {"path": "sub", "content": "x"})


async def test_a_fifo_is_refused_without_hanging(lay: Layout) -> None:
    os.mkfifo(lay.ws / "pipe")
    for name, args in [("read_file", {"path": "pipe"}), ("write_file", {"path": "pipe", "content": "x"})]:
        with pytest.raises(ToolError, match=r"^pipe is not a regular file$"):
            await asyncio.wait_for(lay.call(name, args), 5)
    assert await asyncio.wait_for(lay.call("search", {"pattern": "."}), 5)  # passed over


def test_apply_patch_module_refuses_links_too(lay: Layout) -> None:
    before = lay.outside()
    for text in (
        "*** Begin Patch\n*** Add File: link_up/evil.txt\n+x\n*** End Patch",
        "*** Begin Patch\n*** Update File: link_sibling/results.txt\n*** Move to: stolen.txt\n*** End Patch",
    ):
        with pytest.raises(PatchError, match="symbolic link leading outside the workspace"):
            apply_patch(text, lay.ws)
    assert lay.outside() == before and not (lay.ws / "stolen.txt").exists()


def test_parts_are_worked_out_on_the_text_alone(tmp_path: Path) -> None:
    ws = Workspace(tmp_path)
    assert ws.parts("a/./b//c/") == ("a", "b", "c")
    assert ws.parts("a/../b") == ("b",)
    assert ws.parts(".") == () and ws.parts(str(tmp_path)) == ()
    assert ws.parts(str(tmp_path / "a" / ".." / "b")) == ("b",)
    for path in ("..", "a/../..", "/etc/passwd", str(tmp_path.parent)):
        with pytest.raises(PathError, match="outside the workspace"):
            ws.parts(path)
    with pytest.raises(PathError, match="NUL"):
        ws.parts("a\0b")
    with pytest.raises(PathError, match="empty"):
        ws.parts("  ")


# The agent's own process, swapping its directory d for a link to outside/ and back as fast as it can.
SWAPPER = """
import os, sys
d, parked, target = sys.argv[1:4]
print("swapping", flush=True)
while True:
    try:
        os.rename(d, parked)
        os.symlink(target, d)
        os.unlink(d)
        os.rename(parked, d)
    except OSError:  # a tool call made d meanwhile: start over from whatever is there
        for p in (d, parked):
            if os.path.islink(p):
                os.unlink(p)
        if os.path.isdir(parked) and not os.path.lexists(d):
            os.rename(parked, d)
        elif os.path.isdir(parked):
            os.rename(parked, parked + "-" + os.urandom(4).hex())
"""


async def test_a_directory_swapped_for_a_link_mid_call_never_leads_out(lay: Layout) -> None:
    """Another process swaps ws/d between a real directory and a link to outside/ while write_file, replace and
    apply_patch write under d/ again and again: whatever each call says, nothing is ever written outside. (The
    old check-then-use code, realpath and then write, wrote outside within a few hundred calls.)"""
    d = lay.ws / "d"
    d.mkdir()
    target = lay.base / "outside"
    before = lay.outside()
    swapper = subprocess.Popen(
        [sys.executable, "-c", SWAPPER, str(d), str(lay.ws / "parked"), str(target)], stdout=subprocess.PIPE
    )
    outcomes: set[str] = set()
    try:
        assert swapper.stdout is not None and swapper.stdout.readline() == b"swapping\n"
        for i in range(500):
            for name, args in (
                ("write_file", {"path": "d/f.txt", "content": f"{i}\n"}),
                ("replace", {"path": f"d/r{i}.txt", "old_string": "", "new_string": "x"}),
                ("apply_patch", patch(f"*** Add File: d/p{i}.txt", "+x")),
            ):
                try:
                    await lay.call(name, args)
                    outcomes.add("written")
                except ToolError as error:
                    outcomes.add("refused" if "symbolic link" in str(error) else "other")
    finally:
        swapper.kill()
        swapper.wait()
    assert {"written", "refused"} <= outcomes
    assert lay.outside() == before, "a write went through the link to outside the workspace"
    assert sorted(p.name for p in target.iterdir()) == ["inner.txt"]
