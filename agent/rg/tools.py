"""The research tools: shell, python, files, search, replace, apply_patch, background jobs, end_task.

docs/agent-tools.md compares them with ResearchGym's RGAgent tool by tool.
"""

from __future__ import annotations

import asyncio
import os
import re
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from labkube.agent.blocked_urls import blocked_in_command
from labkube.agent.containment import TOKEN_VARIABLE
from labkube.agent.jobs import JobManager, kill_group, tail
from labkube.agent.rg.output_cap import cap_output
from labkube.agent.rg.tool import Tool, ToolError, tool
from labkube.agent.rg.workspace import Workspace, read_fd, rewrite_fd
from labkube.agent.run_sandbox import RunRoom
from labkube.sandbox import SandboxFailed, sandbox_started
from labkube.task_card import TaskCard


@dataclass
class ToolContext:
    """What every tool of one run shares."""

    workspace: Workspace
    blocked_urls: list[str] = field(default_factory=list)
    default_timeout_s: float = 600.0
    output_limit: int = 16_000
    ended: bool = False
    end_summary: str = ""
    jobs: JobManager | None = None
    time_left: Callable[[], float | None] = lambda: None

    def timeout(self, requested: float | None) -> float:
        """The per-call timeout, never past the end of the time budget."""
        value = float(requested or self.default_timeout_s)
        left = self.time_left()
        return max(1.0, min(value, left)) if left is not None else value

    secret_vars: frozenset[str] = frozenset()  # the run's own key variables (api_key_env)
    room: RunRoom = field(default_factory=RunRoom)  # the run's sandbox (agent/run_sandbox.py), or none

    def start(
        self, argv: list[str], cwd: Path | None = None, status_fd: int | None = None
    ) -> tuple[list[str], dict[str, str]]:
        """What starts `argv` for the agent: the command line (inside the run's sandbox) and its environment."""
        return self.room.command(argv, cwd or self.workspace.root, self.env(), status_fd)

    def env(self) -> dict[str, str]:
        """The environment for the agent's commands: the task's environment active when it has one (else our
        interpreter first on PATH), no API keys."""
        from labkube.tasks.environment import activate, current_env

        env = {
            k: v
            for k, v in os.environ.items()
            if not k.endswith("_API_KEY") and not k.startswith(("LABKUBE_", "RAY_")) and k not in self.secret_vars
        }
        if TOKEN_VARIABLE in os.environ:  # how the run's processes are found at its end (agent/containment.py)
            env[TOKEN_VARIABLE] = os.environ[TOKEN_VARIABLE]
        task_env = current_env()
        if task_env is not None:
            env = activate(task_env.venv, env)
        else:
            env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        env["HOME"] = env.get("HOME", str(self.workspace.root))
        env["PYTHONUNBUFFERED"] = "1"
        # Nobody answers a prompt: a command that asks (apt, git credentials) must fail, not hang until its timeout.
        env["DEBIAN_FRONTEND"] = "noninteractive"
        env["GIT_TERMINAL_PROMPT"] = "0"
        env["PYTHONIOENCODING"] = "utf-8"
        return env


async def run_process(argv: list[str], ctx: ToolContext, timeout: float, stdin: bytes | None = None) -> str:
    """Run `argv` in the workspace (in the run's sandbox where it has one) in its own process group; on timeout,
    kill the whole group. A sandbox that could not be made is the harness's failure (`SandboxFailed`), not output."""
    status_read, status_write = os.pipe() if ctx.room.sandboxed else (None, None)
    try:
        argv, env = ctx.start(argv, status_fd=status_write)
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=ctx.workspace.root,
            env=env,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            pass_fds=() if status_write is None else (status_write,),
        )
    finally:
        if status_write is not None:
            os.close(status_write)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(stdin), timeout=timeout)
    except (TimeoutError, asyncio.CancelledError) as exc:
        kill_group(proc.pid)
        await proc.wait()
        if isinstance(exc, asyncio.CancelledError):
            raise
        raise ToolError(f"timed out after {timeout:g}s; the process group was killed") from None
    finally:
        kill_group(proc.pid)  # background children the command left behind
        status = b""
        if status_read is not None:
            with os.fdopen(status_read, "rb") as fh:
                status = fh.read()
    text = out.decode(errors="replace")
    if status_read is not None and not sandbox_started(status):
        raise SandboxFailed(f"the run's sandbox could not start a command: {last_line(text)}")
    return cap_output(f"{text}[exit code {proc.returncode}]", ctx.output_limit)


def first_status(fd: int, timeout_s: float = 30.0) -> bytes:
    """bubblewrap's first status line (`{"child-pid": N}` once the sandbox is made), or what it wrote before it
    exited; read with a time-out, since a started job keeps the pipe open for as long as it runs. The caller keeps
    `fd` open."""
    import select

    data = b""
    while b"\n" not in data:
        ready, _, _ = select.select([fd], [], [], timeout_s)
        if not ready:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(bubblewrap said nothing)"


def refuse_blocked(ctx: ToolContext, command: str) -> None:
    """A network command that names one of the task's blocked URLs is refused before it runs."""
    hit = blocked_in_command(command, ctx.blocked_urls)
    if hit:
        raise ToolError(f"{hit[0]} is blocked for this task (matches {hit[1]!r}); find another source")


@tool(access="write")
def bash(ctx: ToolContext):
    async def execute(command: str, timeout: int | None = None) -> str:
        """Run a bash command in the workspace and return its combined output and exit code.

        Args:
            command: The command line to run with `bash -c`.
            timeout: Seconds before the command and all its children are killed (default 600).
        """
        refuse_blocked(ctx, command)
        return await run_process(["bash", "-c", command], ctx, ctx.timeout(timeout))

    return execute


@tool(access="write")
def python(ctx: ToolContext):
    async def execute(code: str, timeout: int | None = None) -> str:
        """Run a Python program (given as source text) in the workspace and return its output.

        Args:
            code: Python source to run with the workspace as the working directory.
            timeout: Seconds before the program is killed (default 600).
        """
        from labkube.tasks.environment import current_env, task_python

        task_env = current_env()
        python = task_python(task_env.venv if task_env is not None else None)
        return await run_process([python, "-"], ctx, ctx.timeout(timeout), stdin=code.encode())

    return execute


MAX_TEXT_BYTES = 64_000_000  # read_file and search_file load the whole file to count its lines


def read_text(ctx: ToolContext, path: str) -> tuple[str, list[str]]:
    """A workspace file's relative path and lines; directories, binary and huge files are refused."""
    with ctx.workspace.open(path) as (fd, st):  # no symbolic link followed (agent/rg/workspace.py)
        if stat.S_ISDIR(st.st_mode):
            raise ToolError(f"{path} is a directory; use bash `ls` to list it or `search` to search it")
        size = st.st_size
        if size > MAX_TEXT_BYTES:
            raise ToolError(f"{path} is {size:,} bytes, too large to read whole; use bash (head, sed -n, grep) on it")
        data = read_fd(fd)
    if b"\0" in data[:8192]:
        raise ToolError(f"{path} looks binary ({size:,} bytes); inspect it with python or bash (file, xxd)")
    return ctx.workspace.rel(path), data.decode("utf-8", errors="replace").splitlines()


def numbered(lines: list[str], start: int, marked: int | None = None) -> str:
    """Lines prefixed with their 1-based number; with `marked` (a line number), a marker column shows `>` on it."""
    if marked is None:
        return "\n".join(f"{n:>6}\t{line}" for n, line in enumerate(lines, start=start))
    return "\n".join(f"{'>' if n == marked else ' '}{n:>6}\t{line}" for n, line in enumerate(lines, start=start))


@tool(access="read")
def read_file(ctx: ToolContext):
    async def execute(path: str, start_line: int = 1, max_lines: int = 400) -> str:
        """Read a text file, a chunk of lines at a time, each line prefixed with its number.
        The first line of the output gives the file's total number of lines.

        Args:
            path: File path relative to the workspace.
            start_line: First line to show (1-based).
            max_lines: How many lines to show at most.
        """
        if start_line < 1:
            raise ToolError(f"start_line must be 1 or more (got {start_line})")
        if max_lines < 1:
            raise ToolError(f"max_lines must be 1 or more (got {max_lines})")
        rel, lines = read_text(ctx, path)
        if not lines:
            return f"{rel}: 0 lines (the file is empty)"
        if start_line > len(lines):
            raise ToolError(f"start_line {start_line} is past the end of {rel}, which has {len(lines)} lines")
        chunk = lines[start_line - 1 : start_line - 1 + max_lines]
        end = start_line + len(chunk) - 1
        head = f"{rel}: {len(lines)} lines; showing lines {start_line}-{end}"
        more = f"\n[continue with start_line={end + 1}]" if end < len(lines) else ""
        return cap_output(f"{head}\n{numbered(chunk, start_line)}{more}", ctx.output_limit)

    return execute


@tool(access="read")
def search_file(ctx: ToolContext):
    async def execute(path: str, query: str, context_lines: int = 2, max_matches: int = 5, page: int = 1) -> str:
        """Find a word or phrase in one file (plain text, case-insensitive); shows each matching line, marked
        with `>`, with numbered lines of context, a page of matches at a time.

        Args:
            path: File path relative to the workspace.
            query: The text to look for; letter case is ignored, no regular expressions.
            context_lines: Lines to show before and after each match.
            max_matches: Matches per page.
            page: Which page of matches to show (1-based).
        """
        if not query:
            raise ToolError("query is empty; give the text to look for")
        if context_lines < 0:
            raise ToolError(f"context_lines must be 0 or more (got {context_lines})")
        if max_matches < 1 or page < 1:
            raise ToolError(f"max_matches and page must be 1 or more (got {max_matches} and {page})")
        rel, lines = read_text(ctx, path)
        needle = query.casefold()
        hits = [i for i, line in enumerate(lines) if needle in line.casefold()]
        if not hits:
            return f"no matches for {query!r} in {rel} ({len(lines)} lines)"
        pages = -(-len(hits) // max_matches)
        if page > pages:
            raise ToolError(f"page {page} is past the last page: {len(hits)} matches make {pages} page(s)")
        first = (page - 1) * max_matches
        shown = hits[first : first + max_matches]
        span = f"matches {first + 1}-{first + len(shown)}, page {page} of {pages}"
        blocks = [f"{rel}: {len(hits)} matches for {query!r}; {span}"]
        for number, i in enumerate(shown, start=first + 1):
            lo, hi = max(0, i - context_lines), min(len(lines), i + context_lines + 1)
            context = [line[:1000] for line in lines[lo:hi]]
            blocks.append(f"[match {number} of {len(hits)}, line {i + 1}]\n{numbered(context, lo + 1, marked=i + 1)}")
        if page < pages:
            blocks.append(f"[more matches: page={page + 1}]")
        return cap_output("\n\n".join(blocks), ctx.output_limit)

    return execute


@tool(access="write")
def replace(ctx: ToolContext):
    async def execute(path: str, old_string: str, new_string: str, expected_replacements: int = 1) -> str:
        """Replace an exact piece of text in a file. old_string must match the file exactly (spaces and
        indentation too) and occur exactly expected_replacements times, or nothing changes. An empty
        old_string creates a new file holding new_string.

        Args:
            path: File path relative to the workspace.
            old_string: The exact text to replace; include enough surrounding lines to make it unique.
            new_string: The text to put in its place.
            expected_replacements: How many occurrences there must be; all of them are replaced.
        """
        if expected_replacements < 1:
            raise ToolError(f"expected_replacements must be 1 or more (got {expected_replacements})")
        if old_string == new_string:
            raise ToolError("old_string and new_string are the same; nothing to change")
        ws = ctx.workspace
        rel = ws.rel(path)
        existing = ws.lstat(path)  # refuses a symbolic link; it picks the message, the opens below follow no link
        if existing is not None and stat.S_ISDIR(existing.st_mode):
            raise ToolError(f"{path} is a directory")
        exists = f"{rel} already exists; give old_string to edit it, or use write_file to overwrite it"
        if not old_string:
            if existing is not None:
                raise ToolError(exists)
            data = encode_text(new_string)
            try:
                ws.write_bytes(path, data, exclusive=True)
            except FileExistsError:
                raise ToolError(exists) from None
            return f"created {rel} ({len(data)} bytes)"
        if existing is None:
            raise ToolError(f"{path}: no such file (an empty old_string creates one)")
        with ws.open(path, os.O_RDWR) as (fd, _):  # read and rewritten through one descriptor
            try:
                text = read_fd(fd).decode("utf-8")
            except UnicodeDecodeError:
                raise ToolError(f"{rel} is not UTF-8 text; edit it with python or bash") from None
            at_lines = occurrence_lines(text, old_string)
            count = len(at_lines)
            where = ", ".join(str(n) for n in at_lines[:20])
            if count == 0:
                raise ToolError(
                    f"old_string not found in {rel}; nothing changed (read_file shows the current text: "
                    "spaces, indentation and line breaks must match exactly)"
                )
            if count != expected_replacements:
                raise ToolError(
                    f"old_string occurs {count} times in {rel} (lines {where}), expected {expected_replacements}; "
                    f"nothing changed (add surrounding lines to make it unique, or set expected_replacements={count})"
                )
            rewrite_fd(fd, encode_text(text.replace(old_string, new_string)))
        plural = "s" if count > 1 else ""
        return f"replaced {count} occurrence{plural} in {rel} (at line{plural} {where})"

    return execute


def occurrence_lines(text: str, needle: str) -> list[int]:
    """The 1-based line on which each (non-overlapping) occurrence of `needle` starts."""
    found, at = [], text.find(needle)
    while at != -1:
        found.append(text.count("\n", 0, at) + 1)
        at = text.find(needle, at + len(needle))
    return found


def encode_text(content: str) -> bytes:
    try:
        return content.encode("utf-8")
    except UnicodeEncodeError:
        raise ToolError("content is not valid text (it holds an unpaired surrogate); nothing written") from None


@tool(access="write")
def write_file(ctx: ToolContext):
    async def execute(path: str, content: str) -> str:
        """Create or overwrite a file with the given content (parent directories are created).

        Args:
            path: File path relative to the workspace.
            content: The complete new content of the file.
        """
        rel = ctx.workspace.rel(path)
        data = encode_text(content)
        existed = ctx.workspace.write_bytes(path, data)  # no symbolic link followed (agent/rg/workspace.py)
        return f"{'overwrote' if existed else 'created'} {rel} ({len(data)} bytes)"

    return execute


@tool(access="read")
def search(ctx: ToolContext):
    async def execute(pattern: str, path: str = ".", max_matches: int = 100) -> str:
        """Search the workspace's text files with a regular expression; prints file:line: text.

        Args:
            pattern: A Python regular expression.
            path: File or directory to search, relative to the workspace.
            max_matches: Stop after this many matches.
        """
        try:
            regex = re.compile(pattern)
        except re.error as exc:
            raise ToolError(f"invalid regular expression: {exc}") from None
        hits: list[str] = []
        # Symbolic links below `path` are passed over, never followed; `path` itself being one is refused.
        for rel, fd in ctx.workspace.files(path, skip_dir=lambda d: d == ".git" or d.endswith("/.git")):
            if rel.startswith(".git/") or "/.git/" in rel or os.fstat(fd).st_size > 5_000_000:
                continue
            try:
                text = read_fd(fd).decode("utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            for n, line in enumerate(text.splitlines(), start=1):
                if regex.search(line):
                    hits.append(f"{rel}:{n}: {line[:300]}")
                    if len(hits) >= max_matches:
                        return "\n".join(hits) + f"\n[stopped at {max_matches} matches]"
        return "\n".join(hits) if hits else "no matches"

    return execute


@tool(access="write")
def apply_patch(ctx: ToolContext):
    async def execute(patch: str) -> str:
        """Apply a patch in the V4A format (*** Begin Patch / *** Add File / *** Update File /
        *** Delete File / *** Move to / @@ context / *** End Patch). A patch that does not apply
        changes nothing and says which hunk failed.

        Args:
            patch: The whole patch text, from `*** Begin Patch` to `*** End Patch`.
        """
        from labkube.agent.rg.apply_patch import PatchError
        from labkube.agent.rg.apply_patch import apply_patch as apply_v4a

        try:
            result = apply_v4a(patch, ctx.workspace.root)
        except PatchError as exc:
            raise ToolError(f"patch not applied: {exc}") from None
        return result.summary

    return execute


@tool(access="read")
def end_task(ctx: ToolContext):
    async def execute(summary: str = "") -> str:
        """End the task: call this once you are done. Your workspace is then graded.

        Args:
            summary: What you did and what you found (or, for question tasks, your final answer).
        """
        ctx.ended = True
        ctx.end_summary = summary
        return "task ended"

    return execute


JOB_POLL_S = 0.5  # how often check_async looks whether a job it waits for has exited


def _jobs(ctx: ToolContext) -> JobManager:
    if ctx.jobs is None:
        raise ToolError("background jobs are not available in this run")
    return ctx.jobs


def _job_report(ctx: ToolContext, job_id: str, max_chars: int) -> str:
    record = _jobs(ctx).poll(job_id)
    if record is None:
        raise ToolError(f"no job {job_id!r}; jobs: {', '.join(_jobs(ctx).jobs) or 'none'}")
    state = "running" if record.exit_code is None else f"exited with code {record.exit_code}"
    return f"{record.id} ({record.command!r}): {state}\n{tail(Path(record.log), max_chars)}"


@tool(access="write")
def start_async(ctx: ToolContext):
    async def execute(command: str, workdir: str = ".") -> str:
        """Start a long-running command (a training run) in the background; returns its job id.
        It keeps running across steps; check it with check_async. All jobs stop when the run ends.

        Args:
            command: The command line to run with `bash -c`.
            workdir: Directory to run it in, relative to the workspace.
        """
        refuse_blocked(ctx, command)
        cwd = ctx.workspace.resolve(workdir, must_exist=True)
        if not cwd.is_dir():
            raise ToolError(f"workdir {workdir} is not a directory")
        status_read, status_write = os.pipe() if ctx.room.sandboxed else (None, None)
        try:
            argv, env = ctx.start(["bash", "-c", command], cwd, status_fd=status_write)
            record = _jobs(ctx).start(command, argv, cwd, env, () if status_write is None else (status_write,))
        finally:
            if status_write is not None:
                os.close(status_write)
        if status_read is not None:
            # held open while the job runs: bubblewrap writes the exit code there at the end (a closed pipe would
            # kill it with SIGPIPE, and the job with it)
            _jobs(ctx).hold(record.id, status_read)
            status = await asyncio.to_thread(first_status, status_read)
            if not sandbox_started(status):
                _jobs(ctx).cancel(record.id)
                said = tail(Path(record.log), 600)
                raise SandboxFailed(f"the run's sandbox could not start a background job: {last_line(said)}")
        return (
            f"started {record.id} (pid {record.pid}) in {ctx.workspace.relative(cwd)}; see check_async for its output"
        )

    return execute


@tool(access="read")
def check_async(ctx: ToolContext):
    async def execute(job_id: str, max_chars: int = 4000, wait_minutes: float = 0) -> str:
        """Whether a background job is still running, and the tail of its output. With wait_minutes, first
        wait for the job to finish, up to that long (it returns as soon as the job exits): waiting this way
        costs no steps or tokens, but the time counts against your budget.

        Args:
            job_id: The id start_async returned, e.g. job1.
            max_chars: How much of the end of the output to show.
            wait_minutes: Wait up to this many minutes for the job to exit before reporting (default 0).
        """
        if wait_minutes < 0:
            raise ToolError(f"wait_minutes must be 0 or more (got {wait_minutes:g})")
        record = _jobs(ctx).poll(job_id)
        if record is not None and wait_minutes > 0:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + ctx.timeout(wait_minutes * 60)
            while record.exit_code is None and (left := deadline - loop.time()) > 0:
                await asyncio.sleep(min(JOB_POLL_S, left))
                _jobs(ctx).poll(job_id)
        return _job_report(ctx, job_id, max_chars)

    return execute


@tool(access="write")
def cancel_async(ctx: ToolContext):
    async def execute(job_id: str) -> str:
        """Stop a background job and everything it started.

        Args:
            job_id: The id start_async returned.
        """
        if _jobs(ctx).cancel(job_id) is None:
            raise ToolError(f"no job {job_id!r}")
        return _job_report(ctx, job_id, 2000)

    return execute


def research_tools(ctx: ToolContext) -> list[Tool]:
    return [
        bash(ctx),
        python(ctx),
        read_file(ctx),
        search_file(ctx),
        write_file(ctx),
        replace(ctx),
        search(ctx),
        apply_patch(ctx),
        start_async(ctx),
        check_async(ctx),
        cancel_async(ctx),
        end_task(ctx),
    ]


GAIA_TOOLS = ("bash", "python", "read_file", "search", "end_task")


def tools_for(card: TaskCard, ctx: ToolContext) -> list[Tool]:
    """Paper tasks get every research tool; GAIA questions bash, python, reading and end_task."""
    tools = research_tools(ctx)
    if card.gaia is not None:
        tools = [t for t in tools if t.name in GAIA_TOOLS]
    return tools
