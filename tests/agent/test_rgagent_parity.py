"""The tools and prompt rg-agent took from ResearchGym's RGAgent (docs/agent-tools.md), through their schemas,
with a real workspace, real processes and a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread

import pytest
from tinytask import make_run_dir, make_tiny_task

import labkube.tasks
from labkube.agent.harness.entrypoint import run_agent
from labkube.agent.jobs import JobManager
from labkube.agent.prompts import HINT_PREAMBLE, SYSTEM, task_prompt
from labkube.agent.rg.tool import Tool, ToolError
from labkube.agent.rg.tools import ToolContext, research_tools
from labkube.agent.rg.web import web_browser, web_tools
from labkube.agent.rg.workspace import Workspace
from labkube.budgets import Budgets
from labkube.tasks.researchgym import load_researchgym, read_blocked_urls


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("\n".join(f"line {i}" for i in range(1, 1001)) + "\n")
    return ToolContext(workspace=Workspace(ws), jobs=JobManager(tmp_path / "jobs"))


def tools(ctx: ToolContext) -> dict[str, Tool]:
    return {t.name: t for t in research_tools(ctx)}


def write(ctx: ToolContext, rel: str, text: str) -> Path:
    path = ctx.workspace.root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode())
    return path


# read_file: RGAgent's read_file_chunk (numbered lines, the file's total length)


async def test_read_file_states_the_total_length_and_numbers_each_line(ctx: ToolContext) -> None:
    out = await tools(ctx)["read_file"]({"path": "a.txt", "start_line": 10, "max_lines": 3})
    assert out.splitlines() == [
        "a.txt: 1000 lines; showing lines 10-12",
        "    10\tline 10",
        "    11\tline 11",
        "    12\tline 12",
        "[continue with start_line=13]",
    ]
    last = await tools(ctx)["read_file"]({"path": "a.txt", "start_line": 999, "max_lines": 50})
    assert last.splitlines()[0] == "a.txt: 1000 lines; showing lines 999-1000"
    assert last.endswith("  1000\tline 1000")


async def test_read_file_refuses_what_it_cannot_show(ctx: ToolContext) -> None:
    t = tools(ctx)
    with pytest.raises(ToolError, match=r"start_line 1001 is past the end of a\.txt, which has 1000 lines"):
        await t["read_file"]({"path": "a.txt", "start_line": 1001})
    with pytest.raises(ToolError, match="start_line must be 1 or more"):
        await t["read_file"]({"path": "a.txt", "start_line": 0})
    with pytest.raises(ToolError, match="max_lines must be 1 or more"):
        await t["read_file"]({"path": "a.txt", "max_lines": 0})
    (ctx.workspace.root / "model.bin").write_bytes(b"\x00\x01weights")
    with pytest.raises(ToolError, match="looks binary"):
        await t["read_file"]({"path": "model.bin"})
    with pytest.raises(ToolError, match="no such file"):
        await t["read_file"]({"path": "missing.txt"})
    write(ctx, "empty.txt", "")
    assert await t["read_file"]({"path": "empty.txt"}) == "empty.txt: 0 lines (the file is empty)"


# search_file: case-insensitive plain text in one file, with context lines and pages

CONFIG = """# training
seed = 0
Learning_Rate = 0.1
batch = 32
lr.* = literal
LEARNING_RATE_DECAY = 0.9
"""


async def test_search_file_ignores_case_and_shows_numbered_context(ctx: ToolContext) -> None:
    write(ctx, "config.py", CONFIG)
    out = await tools(ctx)["search_file"]({"path": "config.py", "query": "learning_rate", "context_lines": 1})
    assert out.split("\n\n") == [
        "config.py: 2 matches for 'learning_rate'; matches 1-2, page 1 of 1",
        "[match 1 of 2, line 3]\n      2\tseed = 0\n>     3\tLearning_Rate = 0.1\n      4\tbatch = 32",
        "[match 2 of 2, line 6]\n      5\tlr.* = literal\n>     6\tLEARNING_RATE_DECAY = 0.9",
    ]


async def test_search_file_matches_plain_text_not_regular_expressions(ctx: ToolContext) -> None:
    write(ctx, "config.py", CONFIG)
    search_file = tools(ctx)["search_file"]
    literal = await search_file({"path": "config.py", "query": "lr.*", "context_lines": 0})
    assert "[match 1 of 1, line 5]\n>     5\tlr.* = literal" in literal
    assert await search_file({"path": "config.py", "query": "rate.*0"}) == (
        "no matches for 'rate.*0' in config.py (6 lines)"
    )


async def test_search_file_pages_through_many_matches(ctx: ToolContext) -> None:
    search_file = tools(ctx)["search_file"]
    args = {"path": "a.txt", "query": "line 1", "context_lines": 0, "max_matches": 50}
    first = await search_file(args)  # "line 1", "line 10".."line 19", "line 100".."line 199", "line 1000"
    assert first.startswith("a.txt: 112 matches for 'line 1'; matches 1-50, page 1 of 3")
    assert first.count("[match ") == 50 and first.endswith("[more matches: page=2]")
    last = await search_file({**args, "page": 3})
    assert "matches 101-112, page 3 of 3" in last and "[match 112 of 112, line 1000]" in last
    assert "more matches" not in last
    with pytest.raises(ToolError, match="page 4 is past the last page: 112 matches make 3 page"):
        await search_file({**args, "page": 4})


async def test_search_file_errors_are_clear(ctx: ToolContext) -> None:
    search_file = tools(ctx)["search_file"]
    with pytest.raises(ToolError, match="query is empty"):
        await search_file({"path": "a.txt", "query": ""})
    with pytest.raises(ToolError, match="context_lines must be 0 or more"):
        await search_file({"path": "a.txt", "query": "line", "context_lines": -1})
    with pytest.raises(ToolError, match="is a directory"):
        await search_file({"path": ".", "query": "line"})
    with pytest.raises(ToolError, match="outside the workspace"):
        await search_file({"path": "../jobs", "query": "line"})


# replace: exact string replacement


async def test_replace_changes_exactly_the_given_text_and_nothing_else(ctx: ToolContext) -> None:
    path = write(ctx, "train.py", "def train():\r\n    lr = 0.1\r\n    return lr\r\n")
    out = await tools(ctx)["replace"]({"path": "train.py", "old_string": "lr = 0.1", "new_string": "lr = 0.05"})
    assert out == "replaced 1 occurrence in train.py (at line 2)"
    assert path.read_bytes() == b"def train():\r\n    lr = 0.05\r\n    return lr\r\n"  # line endings kept


async def test_replace_fails_clearly_when_the_text_is_absent(ctx: ToolContext) -> None:
    path = write(ctx, "train.py", "def train():\n    lr = 0.1\n")
    with pytest.raises(ToolError, match=r"old_string not found in train\.py; nothing changed"):
        await tools(ctx)["replace"]({"path": "train.py", "old_string": "lr=0.1", "new_string": "x"})
    with pytest.raises(ToolError, match="old_string not found"):  # indentation must match exactly
        await tools(ctx)["replace"]({"path": "train.py", "old_string": "\tlr = 0.1", "new_string": "x"})
    assert path.read_text() == "def train():\n    lr = 0.1\n"


async def test_replace_fails_clearly_when_the_text_is_ambiguous(ctx: ToolContext) -> None:
    text = "a = 1\nb = 2\na = 1\n"
    path = write(ctx, "m.py", text)
    replace = tools(ctx)["replace"]
    with pytest.raises(ToolError, match=r"occurs 2 times in m.py \(lines 1, 3\), expected 1; nothing changed"):
        await replace({"path": "m.py", "old_string": "a = 1", "new_string": "a = 3"})
    assert path.read_text() == text
    with pytest.raises(ToolError, match=r"occurs 2 times in m\.py .*, expected 3"):
        await replace({"path": "m.py", "old_string": "a = 1", "new_string": "a = 3", "expected_replacements": 3})
    out = await replace({"path": "m.py", "old_string": "a = 1", "new_string": "a = 3", "expected_replacements": 2})
    assert out == "replaced 2 occurrences in m.py (at lines 1, 3)"
    assert path.read_text() == "a = 3\nb = 2\na = 3\n"


async def test_replace_with_empty_old_string_creates_a_file_only_if_absent(ctx: ToolContext) -> None:
    replace = tools(ctx)["replace"]
    assert (
        await replace({"path": "new/n.py", "old_string": "", "new_string": "x = 1\n"}) == "created new/n.py (6 bytes)"
    )
    assert (ctx.workspace.root / "new" / "n.py").read_text() == "x = 1\n"
    with pytest.raises(ToolError, match=r"new/n\.py already exists"):
        await replace({"path": "new/n.py", "old_string": "", "new_string": "y = 2\n"})
    with pytest.raises(ToolError, match="no such file"):
        await replace({"path": "gone.py", "old_string": "a", "new_string": "b"})
    with pytest.raises(ToolError, match="outside the workspace"):
        await replace({"path": "../escape.py", "old_string": "", "new_string": "x"})
    assert not (ctx.workspace.root.parent / "escape.py").exists()
    with pytest.raises(ToolError, match="the same"):
        await replace({"path": "new/n.py", "old_string": "x", "new_string": "x"})


async def test_write_file_says_whether_it_created_or_overwrote(ctx: ToolContext) -> None:
    write_file = tools(ctx)["write_file"]
    assert await write_file({"path": "out/r.txt", "content": "1"}) == "created out/r.txt (1 bytes)"
    assert await write_file({"path": "out/r.txt", "content": "22"}) == "overwrote out/r.txt (2 bytes)"
    assert (ctx.workspace.root / "out" / "r.txt").read_text() == "22"


# bash and background jobs


async def test_commands_cannot_stop_on_an_interactive_prompt(ctx: ToolContext) -> None:
    out = await tools(ctx)["bash"]({"command": "echo $DEBIAN_FRONTEND $GIT_TERMINAL_PROMPT $PYTHONIOENCODING"})
    assert out.startswith("noninteractive 0 utf-8\n")


async def test_check_async_waits_for_a_job_and_returns_when_it_exits(ctx: ToolContext) -> None:
    t = tools(ctx)
    await t["start_async"]({"command": "sleep 0.6; echo trained"})
    started = time.monotonic()
    report = await t["check_async"]({"job_id": "job1", "wait_minutes": 1})
    assert time.monotonic() - started < 5  # not the full minute
    assert "exited with code 0" in report and "trained" in report


async def test_check_async_wait_ends_at_its_limit_while_the_job_runs_on(ctx: ToolContext) -> None:
    t = tools(ctx)
    await t["start_async"]({"command": "sleep 30"})
    started = time.monotonic()
    report = await t["check_async"]({"job_id": "job1", "wait_minutes": 0.02})
    assert 1.0 <= time.monotonic() - started < 5
    assert "job1 ('sleep 30'): running" in report
    with pytest.raises(ToolError, match="wait_minutes must be 0 or more"):
        await t["check_async"]({"job_id": "job1", "wait_minutes": -1})
    await t["cancel_async"]({"job_id": "job1"})


async def test_start_async_runs_in_a_workdir_inside_the_workspace(ctx: ToolContext) -> None:
    t = tools(ctx)
    write(ctx, "exp/run.sh", "echo from exp")
    assert "in exp" in await t["start_async"]({"command": "bash run.sh; pwd", "workdir": "exp"})
    report = await t["check_async"]({"job_id": "job1", "wait_minutes": 0.5})
    assert "from exp" in report and str(ctx.workspace.root / "exp") in report
    with pytest.raises(ToolError, match="outside the workspace"):
        await t["start_async"]({"command": "pwd", "workdir": ".."})
    with pytest.raises(ToolError, match="not a directory"):
        await t["start_async"]({"command": "pwd", "workdir": "a.txt"})


# web_browser: a page's text, with the task's blocked URLs enforced (also behind redirects)

PAGE = """<!doctype html><html><head><title>Replay  buffers</title>
<style>body { color: red }</style><script>trackVisitor("secret-js")</script></head>
<body><h1>Prioritised replay &amp; friends</h1>
<p>Sample transitions by
TD error.</p><noscript>enable javascript</noscript>
<ul><li>alpha = 0.6</li><li>beta annealed to 1</li></ul>
<a href="/docs/next.html">Next section</a> <a href="/papers/sd-lora-class-incremental.pdf">the paper</a>
</body></html>"""

BLOCKED_YAML = """urls:
  - 127.0.0.1:{port}/arxiv/abs/2501.13198
patterns:
  - "*SD-LoRA*class*incremental*"
  - "*/private/*"
"""


@dataclass
class Site:
    """A local web site that records every path it was asked for."""

    base: str
    requested: list[str] = field(default_factory=list)


class SiteHandler(BaseHTTPRequestHandler):
    routes: dict[str, tuple[int, dict[str, str], bytes]] = {}

    def do_GET(self) -> None:
        self.server.site.requested.append(self.path)  # type: ignore[attr-defined]
        status, headers, body = self.routes.get(self.path, (404, {"Content-Type": "text/plain"}, b"not found"))
        self.send_response(status)
        for key, value in {**headers, "Content-Length": str(len(body))}.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        return None


def html(body: str) -> tuple[int, dict[str, str], bytes]:
    return 200, {"Content-Type": "text/html; charset=utf-8"}, body.encode()


def redirect(to: str) -> tuple[int, dict[str, str], bytes]:
    return 302, {"Location": to}, b""


SiteHandler.routes = {
    "/replay.html": html(PAGE),
    "/docs/next.html": html("<p>next</p>"),
    "/papers/SD-LoRA-class-incremental.html": html("<p>the method, spelled out</p>"),
    "/private/notes.html": html("<p>private</p>"),
    "/go/paper": redirect("/papers/SD-LoRA-class-incremental.html"),
    "/go/hop": redirect("/go/paper"),
    "/go/docs": redirect("/docs/next.html"),
    "/long.html": html("<pre>" + "\n".join(f"row {i:05d} " + "x" * 40 for i in range(1000)) + "</pre>"),
    "/odd.html": html("<p>before</p><![foo bar]><p>after <a href='http://[::1'>a broken link</a></p>"),
    "/paper.pdf": (200, {"Content-Type": "application/pdf"}, b"%PDF-1.7 binary"),
    "/data.json": (200, {"Content-Type": "application/json"}, json.dumps({"alpha": 0.6}).encode()),
}


@pytest.fixture
def site() -> Iterator[Site]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), SiteHandler)
    server.site = Site(base=f"http://127.0.0.1:{server.server_port}")  # type: ignore[attr-defined]
    thread = Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.site  # type: ignore[attr-defined]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def browser(ctx: ToolContext, site: Site, tmp_path: Path) -> Tool:
    """web_browser for a task whose blocked_urls.yaml lists URLs and globs, read as a task's is."""
    task = tmp_path / "task"
    task.mkdir()
    (task / "blocked_urls.yaml").write_text(BLOCKED_YAML.format(port=site.base.rsplit(":", 1)[1]))
    ctx.blocked_urls, warnings = read_blocked_urls(task)
    assert not warnings and len(ctx.blocked_urls) == 3
    return web_browser(ctx)


async def test_web_browser_returns_a_page_as_readable_text(browser: Tool, site: Site) -> None:
    out = await browser({"url": f"{site.base}/replay.html"})
    head, text = out.split("\n\n", 1)
    assert head == f"[HTTP 200] {site.base}/replay.html\nTitle: Replay buffers"
    assert text.startswith(
        "# Prioritised replay & friends\n\nSample transitions by TD error.\n\n- alpha = 0.6\n- beta annealed to 1"
    )
    assert "secret-js" not in out and "color: red" not in out and "enable javascript" not in out
    assert "<" not in text.split("Links:")[0]
    assert f"- Next section: {site.base}/docs/next.html" in out
    assert "sd-lora" not in out.lower() and "1 link(s) to blocked sources left out" in out


async def test_web_browser_refuses_blocked_urls_without_requesting_them(browser: Tool, site: Site) -> None:
    for path in ("/papers/SD-LoRA-class-incremental.html", "/private/notes.html", "/arxiv/abs/2501.13198v2"):
        with pytest.raises(ToolError, match=r"is blocked for this task .*; find another source"):
            await browser({"url": site.base + path})
    assert site.requested == []


async def test_web_browser_refuses_a_redirect_to_a_blocked_url(browser: Tool, site: Site) -> None:
    with pytest.raises(ToolError, match=r"/go/paper redirects to .*SD-LoRA-class-incremental.html, which is blocked"):
        await browser({"url": f"{site.base}/go/paper"})
    with pytest.raises(ToolError, match=r"redirects to .* which is blocked"):
        await browser({"url": f"{site.base}/go/hop"})  # two hops
    assert site.requested == ["/go/paper", "/go/hop", "/go/paper"]  # the blocked page never


async def test_web_browser_follows_an_allowed_redirect(browser: Tool, site: Site) -> None:
    out = await browser({"url": f"{site.base}/go/docs"})
    assert out.startswith(f"[HTTP 200] {site.base}/docs/next.html\n(redirected from {site.base}/go/docs)")
    assert out.endswith("\n\nnext")


async def test_web_browser_caps_a_long_page_and_pages_through_it(browser: Tool, ctx: ToolContext, site: Site) -> None:
    first = await browser({"url": f"{site.base}/long.html"})
    assert len(first) <= ctx.output_limit and "[part 1 of 5; continue with page=2]" in first
    assert "row 00000" in first and "row 00999" not in first
    last = await browser({"url": f"{site.base}/long.html", "page": 5})
    assert "[part 5 of 5]" in last and "row 00999" in last and "row 00000" not in last
    with pytest.raises(ToolError, match=r"page 6 is past the end: .* has 5 part"):
        await browser({"url": f"{site.base}/long.html", "page": 6})


async def test_web_browser_reads_text_types_and_refuses_binary_ones(browser: Tool, site: Site) -> None:
    assert (await browser({"url": f"{site.base}/data.json"})).endswith('\n\n{"alpha": 0.6}')
    with pytest.raises(ToolError, match="is application/pdf, not a text page"):
        await browser({"url": f"{site.base}/paper.pdf"})
    with pytest.raises(ToolError, match="only http"):
        await browser({"url": "file:///etc/passwd"})
    with pytest.raises(ToolError, match="could not open"):
        await browser({"url": "http://127.0.0.1:1/closed"})


async def test_web_browser_reads_malformed_html(browser: Tool, site: Site) -> None:
    out = await browser({"url": f"{site.base}/odd.html"})
    assert out.endswith("\n\nbefore\n\nafter a broken link")  # the bad marked section and href are skipped


def test_web_tools_are_offline_by_default(ctx: ToolContext, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LABKUBE_WEB_SEARCH", raising=False)
    assert web_tools(ctx) == []
    monkeypatch.setenv("LABKUBE_WEB_SEARCH", "off")
    assert web_tools(ctx) == []
    monkeypatch.setenv("LABKUBE_WEB_SEARCH", "searxng:http://127.0.0.1:8888")
    assert [t.name for t in web_tools(ctx)] == ["web_search", "web_browser"]


# the system prompt: time, budget, grading and hints, as RGAgent states them


def bundled_card():
    task_dir = Path(labkube.tasks.__file__).parent / "bundled" / "researchgym" / "continual-learning-lite"
    return load_researchgym(task_dir, "researchgym/continual-learning-lite")


def test_system_prompt_states_how_time_budget_and_grading_work() -> None:
    assert "Everything counts against it, including the commands and training runs you start" in SYSTEM
    assert "a good solution is expected to need most of it" in SYSTEM
    assert "scores your workspace as it stands when the run ends: when you call end_task, or when a budget" in SYSTEM
    assert "restored from the original task before grading" in SYSTEM
    assert "no fallbacks, dummy data or hard-coded outputs" in SYSTEM
    assert "commit your work with git regularly" in SYSTEM
    assert "If you have the web_search tool, survey related work" in SYSTEM


def test_task_prompt_states_budget_compute_grading_and_keeps_sota_hidden() -> None:
    card = bundled_card()
    prompt = task_prompt(card, "Your workspace is /ws.", Budgets(wall_hours=12, usd=10), None)
    assert "Your budget: 12 hours of wall time, $10.00 of model spend." in prompt
    assert "Compute: no GPU, 1 CPU and 2 GB of memory." in prompt
    assert "Grader: `bash grading/grade.sh`" in prompt
    assert "- avg_acc (primary): Avg Acc, higher is better, baseline to beat 0.221" in prompt
    assert "- forgetting: Forgetting, lower is better, baseline to beat 0.9454" in prompt
    assert "Protected (restored before grading): grading/**, task_description.md, data/**." in prompt
    assert "Held out (only the task's own code may read them): data/heldout/**." in prompt
    assert "0.842" not in prompt and "0.0735" not in prompt  # the paper's values are never shown
    assert HINT_PREAMBLE not in prompt


def test_task_prompt_tells_how_to_use_a_hint() -> None:
    prompt = task_prompt(bundled_card(), "", Budgets(), "Keep a replay memory.")
    assert "Your budget: no fixed limit." in prompt
    assert prompt.endswith(
        "## Hint\nYou are given an idea that is known to work. Implement it faithfully first, "
        "then build on it to improve the results further.\n\nKeep a replay memory."
    )


async def test_a_run_opens_with_the_prompt_stating_its_budget_and_grading(tmp_path: Path) -> None:
    task = make_tiny_task(tmp_path, [{"tool": "end_task", "args": {"summary": "done"}}])
    run_dir = make_run_dir(tmp_path, task, budgets=Budgets(wall_hours=2, usd=10))
    await run_agent(run_dir)
    opening = [json.loads(line) for line in (run_dir / "conversation.jsonl").read_text().splitlines()[:2]]
    assert [m["role"] for m in opening] == ["system", "user"]
    assert opening[0]["content"] == SYSTEM
    user = opening[1]["content"]
    assert "Your budget: 2 hours of wall time, $10.00 of model spend." in user
    assert "- score (primary): Score, higher is better, baseline to beat 1" in user
    assert "10" not in user.split("## Grading")[1]  # the SOTA (10) stays hidden
