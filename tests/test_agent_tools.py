"""The research tools, each through its model-facing schema, with the real workspace and processes."""

from __future__ import annotations

import asyncio
import json
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread

import pytest

from labkube.agent.jobs import JobManager
from labkube.agent.rg.tool import ToolError, tool
from labkube.agent.rg.tools import ToolContext, research_tools
from labkube.agent.rg.web import SearxngBackend, web_browser, web_search
from labkube.agent.rg.workspace import Workspace


def alive(pid: int) -> bool:
    """Running, as opposed to gone or a zombie waiting for a reaper."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("\n".join(f"line {i}" for i in range(1, 1001)) + "\n")
    (ws / "src").mkdir()
    (ws / "src" / "m.py").write_text("def train():\n    lr = 0.1\n    return lr\n")
    return ToolContext(
        workspace=Workspace(ws),
        blocked_urls=["arxiv.org/abs/1234.5678", "github.com/paper/*"],
        jobs=JobManager(tmp_path / "jobs"),
    )


def tools(ctx: ToolContext) -> dict:
    return {t.name: t for t in research_tools(ctx)}


async def test_every_tool_has_a_schema_from_its_signature(ctx: ToolContext) -> None:
    specs = {t.name: t.spec for t in research_tools(ctx)}
    assert set(specs) == {
        "bash",
        "python",
        "read_file",
        "search_file",
        "write_file",
        "replace",
        "search",
        "apply_patch",
        "start_async",
        "check_async",
        "cancel_async",
        "end_task",
    }
    bash = specs["bash"].parameters
    assert bash["required"] == ["command"]
    assert bash["properties"]["timeout"]["type"] == "integer"
    assert "bash -c" in bash["properties"]["command"]["description"]


def test_a_tool_without_a_docstring_is_refused() -> None:
    @tool(access="read")
    def undocumented():
        async def execute(x: str) -> str:
            return x

        return execute

    with pytest.raises(TypeError, match="no docstring"):
        undocumented()


async def test_bad_arguments_are_tool_errors(ctx: ToolContext) -> None:
    t = tools(ctx)
    with pytest.raises(ToolError, match="missing required"):
        await t["bash"]({})
    with pytest.raises(ToolError, match="unknown argument"):
        await t["bash"]({"command": "true", "cwd": "/"})
    with pytest.raises(ToolError, match="must be integer"):
        await t["read_file"]({"path": "a.txt", "start_line": "3"})


async def test_bash_returns_output_and_exit_code(ctx: ToolContext) -> None:
    out = await tools(ctx)["bash"]({"command": "echo hi; ls src; exit 3"})
    assert "hi" in out and "m.py" in out and "[exit code 3]" in out


async def test_bash_timeout_kills_the_whole_process_group(ctx: ToolContext, tmp_path: Path) -> None:
    marker = tmp_path / "child.pid"
    started = time.monotonic()
    with pytest.raises(ToolError, match="timed out"):
        await tools(ctx)["bash"]({"command": f"(sleep 30 & echo $! > {marker}; wait)", "timeout": 1})
    assert time.monotonic() - started < 5
    child, deadline = int(marker.read_text()), time.monotonic() + 5
    while alive(child):  # SIGKILLed with its group: gone once the kernel has reaped it
        assert time.monotonic() < deadline, f"the timed-out command's child {child} is alive 5 s later"
        await asyncio.sleep(0.02)


async def test_bash_output_is_capped_keeping_head_and_tail(ctx: ToolContext) -> None:
    out = await tools(ctx)["bash"]({"command": "seq 1 100000"})
    assert len(out) < 20_000
    assert out.startswith("1\n2\n") and "100000" in out and "characters omitted" in out


async def test_bash_refuses_blocked_urls(ctx: ToolContext) -> None:
    with pytest.raises(ToolError, match="blocked"):
        await tools(ctx)["bash"]({"command": "curl -L https://arxiv.org/abs/1234.5678"})
    with pytest.raises(ToolError, match="blocked"):
        await tools(ctx)["bash"]({"command": "git clone https://github.com/paper/code.git"})
    out = await tools(ctx)["bash"]({"command": "echo arxiv.org/abs/1234.5678"})  # not a network command
    assert "[exit code 0]" in out


async def test_commands_see_no_api_keys(ctx: ToolContext, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-secret")
    out = await tools(ctx)["bash"]({"command": "env"})
    assert "sk-test-secret" not in out


async def test_python_tool_runs_code_in_the_workspace(ctx: ToolContext) -> None:
    out = await tools(ctx)["python"]({"code": "import os; print(sorted(os.listdir('.')))"})
    assert "a.txt" in out and "[exit code 0]" in out


async def test_read_file_is_chunked_by_lines(ctx: ToolContext) -> None:
    out = await tools(ctx)["read_file"]({"path": "a.txt", "start_line": 10, "max_lines": 3})
    assert "    10\tline 10" in out and "line 12" in out and "line 13" not in out
    assert "continue with start_line=13" in out


@pytest.mark.parametrize("path", ["../outside.txt", "/etc/passwd", "src/../../x", "link/secret"])
async def test_file_tools_stay_inside_the_workspace(ctx: ToolContext, tmp_path: Path, path: str) -> None:
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "secret").write_text("s")
    (ctx.workspace.root / "link").symlink_to(tmp_path / "secret")
    t = tools(ctx)
    with pytest.raises(ToolError, match="outside the workspace"):
        await t["read_file"]({"path": path})
    with pytest.raises(ToolError, match="outside the workspace"):
        await t["write_file"]({"path": path, "content": "x"})


async def test_write_file_creates_parents(ctx: ToolContext) -> None:
    out = await tools(ctx)["write_file"]({"path": "new/dir/f.txt", "content": "hello"})
    assert (ctx.workspace.root / "new" / "dir" / "f.txt").read_text() == "hello"
    assert "new/dir/f.txt" in out


async def test_search_reports_file_and_line(ctx: ToolContext) -> None:
    out = await tools(ctx)["search"]({"pattern": r"lr = \d"})
    assert out == "src/m.py:2:     lr = 0.1"
    with pytest.raises(ToolError, match="invalid regular expression"):
        await tools(ctx)["search"]({"pattern": "("})


async def test_apply_patch_tool_applies_or_changes_nothing(ctx: ToolContext) -> None:
    patch = (
        "*** Begin Patch\n*** Update File: src/m.py\n@@ def train():\n-    lr = 0.1\n+    lr = 0.05\n*** End Patch\n"
    )
    out = await tools(ctx)["apply_patch"]({"patch": patch})
    assert "src/m.py" in out and "lr = 0.05" in (ctx.workspace.root / "src" / "m.py").read_text()
    with pytest.raises(ToolError, match="patch not applied"):
        await tools(ctx)["apply_patch"]({"patch": patch})


async def test_async_jobs_survive_steps_and_are_cancelled(ctx: ToolContext) -> None:
    t = tools(ctx)
    started = await t["start_async"]({"command": "for i in 1 2 3; do echo epoch $i; sleep 0.2; done; echo done"})
    assert "job1" in started
    assert "running" in await t["check_async"]({"job_id": "job1"})
    deadline = time.monotonic() + 10
    while "running" in (report := await t["check_async"]({"job_id": "job1"})):
        assert time.monotonic() < deadline, report
        await asyncio.sleep(0.05)
    assert "exited with code 0" in report and "epoch 3" in report and "done" in report
    await t["start_async"]({"command": "sleep 60"})
    cancelled = await t["cancel_async"]({"job_id": "job2"})
    assert "exited with code -9" in cancelled
    with pytest.raises(ToolError, match="no job"):
        await t["check_async"]({"job_id": "job9"})


async def test_end_task_marks_the_context(ctx: ToolContext) -> None:
    await tools(ctx)["end_task"]({"summary": "42"})
    assert ctx.ended and ctx.end_summary == "42"


class FakeSearxng(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path.startswith("/search"):
            body = {
                "results": [
                    {"url": "https://arxiv.org/abs/1234.5678", "title": "The paper", "content": "blocked"},
                    {
                        "url": f"http://127.0.0.1:{self.server.server_port}/page",
                        "title": "A page",
                        "content": "ok",
                    },
                ]
            }
            data = json.dumps(body).encode()
            ctype = "application/json"
        else:
            data = b"<html><script>x()</script><body><h1>Title</h1><p>Some text.</p></body></html>"
            ctype = "text/html"
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        return None


async def test_web_search_drops_blocked_results_and_web_browser_refuses_them(ctx: ToolContext) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeSearxng)
    thread = Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_port}"
        search = web_search(ctx, SearxngBackend(base))
        out = await search({"query": "continual learning"})
        assert "A page" in out and "arxiv.org" not in out and "1 result(s) from blocked sources" in out
        browser = web_browser(ctx)
        page = await browser({"url": f"{base}/page"})
        assert "Title" in page and "Some text." in page and "x()" not in page
        with pytest.raises(ToolError, match="blocked"):
            await browser({"url": "https://arxiv.org/abs/1234.5678v2"})
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
