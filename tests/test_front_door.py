"""The front door (issue #25 items 1 and 2): each bad input of the issue's table, typed as a user types it, is one
line on stderr that says what to do, exit 2, and writes nothing; the CLI as a subprocess (tests/cli_helpers.py).

The unknown-model, unknown-task and malformed-campaign-file rows are in tests/test_spine_e2e.py, the missing and
empty `replay:` files in tests/test_local_paths.py; this file does not repeat them.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from cli_helpers import BUNDLED_TASK, labkube, tree_digest
from click.testing import CliRunner

from labkube.agent.containment import read_record, tagged_pids
from labkube.cli_checks import BUG_LINE, FrontDoor
from labkube.model_ref import UnknownModel, parse_model
from labkube.store import StoreError
from labkube.tasks import BUNDLED, TaskError

pytestmark = pytest.mark.slow
TASK_DIR = BUNDLED / "researchgym" / "continual-learning-lite"


def refused(proc: subprocess.CompletedProcess, expected: str) -> str:
    """The one line of a refusal, checked: exit 2, no traceback, `expected` in it."""
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ") or lines[0].startswith("Error: "), lines[0]
    assert expected in lines[0], lines[0]
    return lines[0]


def refused_writing_nothing(tmp_path: Path, *args: str, expected: str, env: dict[str, str] | None = None) -> str:
    before = tree_digest(tmp_path)
    proc = labkube(*args, cwd=tmp_path, env=env, timeout=60)
    line = refused(proc, expected)
    assert tree_digest(tmp_path) == before, "something was written"
    return line


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished noop campaign on a copy of the bundled task (so that the task folder can be moved)."""
    work = tmp_path_factory.mktemp("front-door")
    shutil.copytree(TASK_DIR, work / "task")
    proc = labkube("run", str(work / "task"), "--model", "noop", "--out", str(work / "camp"), cwd=work, timeout=300)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return work / "camp"


@pytest.fixture
def copied(campaign: Path, tmp_path: Path) -> Path:
    out = tmp_path / "camp"
    shutil.copytree(campaign, out, symlinks=True)
    return out


def run_dir(cdir: Path) -> Path:
    (run,) = (cdir / "runs").iterdir()
    return run


# -- labkube run: output paths, ports, the Ray address, budgets, models, tasks ---------------------------------


@pytest.mark.parametrize("under_a_file", [True, False], ids=["out-under-a-file", "out-is-a-file"])
def test_an_out_that_is_or_is_under_a_regular_file(tmp_path: Path, under_a_file: bool) -> None:
    (tmp_path / "notes.txt").write_text("mine\n")
    out = "notes.txt/x" if under_a_file else "notes.txt"
    line = refused_writing_nothing(tmp_path, "run", BUNDLED_TASK, "--out", out, expected=f"--out {out}: ")
    assert "is a file, not a directory" in line


def test_an_out_under_etc_hostname(tmp_path: Path) -> None:
    if not Path("/etc/hostname").is_file():
        pytest.skip("no /etc/hostname on this machine")
    refused_writing_nothing(tmp_path, "run", BUNDLED_TASK, "--out", "/etc/hostname/x", expected="is a file")


def test_a_metrics_port_in_use_is_refused_before_campaign_json(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("", 0))
        holder.listen()
        port = holder.getsockname()[1]
        line = refused_writing_nothing(
            tmp_path,
            "run",
            BUNDLED_TASK,
            "--model",
            "noop",
            "--metrics-port",
            str(port),
            "--out",
            "c",
            expected=f"--metrics-port {port}: already in use",
        )
    assert "choose another port" in line


@pytest.mark.parametrize(
    "address",
    ["127.0.0.1:1", "ray://127.0.0.1:1"],
    ids=["gcs-address", "ray-client-address"],
)
def test_a_ray_address_where_nothing_answers_is_refused_within_seconds(tmp_path: Path, address: str) -> None:
    started = time.monotonic()
    line = refused_writing_nothing(
        tmp_path,
        "run",
        BUNDLED_TASK,
        "--model",
        "noop",
        "--ray-address",
        address,
        "--out",
        "c",
        expected=f"--ray-address {address}: no Ray cluster answers there",
    )
    assert time.monotonic() - started < 20  # one bounded connect of 3 s, not Ray's minutes of retries
    assert "ray start --head" in line


@pytest.mark.parametrize("form", ["{}", "ray://{}"], ids=["gcs-address", "ray-client-address"])
def test_a_ray_address_where_something_else_answers_is_refused(tmp_path: Path, form: str) -> None:
    """A web server on the port passes a TCP connect; the HTTP/2 handshake every gRPC server (a Ray head's GCS and its
    Ray Client server, tests/test_ray_connect.py) answers is what tells Ray from it."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    address = form.format(f"127.0.0.1:{server.server_port}")
    try:
        line = refused_writing_nothing(
            tmp_path,
            "run",
            BUNDLED_TASK,
            "--model",
            "noop",
            "--ray-address",
            address,
            "--out",
            "c",
            expected=f"--ray-address {address}: something answers there, but not Ray",
        )
    finally:
        server.shutdown()
        server.server_close()
    assert "ray start --head" in line


@pytest.mark.parametrize("address", ["headnode", "10.0.0.1:port", "ray://"])
def test_a_ray_address_that_is_not_host_and_port(tmp_path: Path, address: str) -> None:
    refused_writing_nothing(
        tmp_path,
        "run",
        BUNDLED_TASK,
        "--ray-address",
        address,
        "--out",
        "c",
        expected=f"--ray-address {address}: write HOST:PORT",
    )


@pytest.mark.parametrize(
    ("flag", "value", "expected"),
    [
        ("--budget-hours", "inf", "--budget-hours inf: give a finite number above 0"),
        ("--budget-hours", "nan", "--budget-hours nan: give a finite number above 0"),
        ("--budget-usd", "-3", "--budget-usd -3.0: give a finite number above 0"),
        ("--budget-steps", "0", "--budget-steps 0: give a whole number above 0"),
        ("--inspector-budget-usd", "inf", "--inspector-budget-usd inf: give a finite number"),
    ],
)
def test_budgets_are_finite_and_positive(tmp_path: Path, flag: str, value: str, expected: str) -> None:
    refused_writing_nothing(tmp_path, "run", BUNDLED_TASK, flag, value, "--out", "c", expected=expected)


def test_an_infinite_budget_in_a_campaign_file_is_refused(tmp_path: Path) -> None:
    spec = tmp_path / "c.yaml"
    spec.write_text(f"tasks: [{BUNDLED_TASK}]\nbudgets: {{wall_hours: .inf}}\n")
    refused_writing_nothing(
        tmp_path, "campaign", "run", str(spec), "--out", "c", expected="budgets.wall_hours is inf; give a finite number"
    )


@pytest.mark.parametrize(
    "model",
    ["openai:gpt-5@4096", "openai-chat:gpt-5@4096", "openai-compatible:http://127.0.0.1:8000/v1#qwen@2048"],
)
def test_a_token_budget_after_an_openai_model_is_refused(tmp_path: Path, model: str) -> None:
    line = refused_writing_nothing(
        tmp_path, "run", BUNDLED_TASK, "--model", model, "--out", "c", expected="takes a reasoning effort name"
    )
    assert "minimal, low, medium, high" in line


def test_anthropic_takes_thinking_budget_names_and_tokens_only() -> None:
    assert parse_model("anthropic:claude-sonnet-4-5@4096").effort == "4096"
    assert parse_model("anthropic:claude-sonnet-4-5@high").effort == "high"
    assert parse_model("openai:gpt-5@minimal").effort == "minimal"
    for bad in ("anthropic:claude-sonnet-4-5@minimal", "anthropic:claude-sonnet-4-5@100", "openai:gpt-5@4096"):
        with pytest.raises(UnknownModel):
            parse_model(bad)


@pytest.mark.parametrize("task", [".", ""], ids=["dot", "empty"])
def test_run_on_a_folder_that_is_not_a_task_says_so(tmp_path: Path, task: str) -> None:
    (tmp_path / "a11").mkdir()
    (tmp_path / "a11" / "campaign.json").write_text('{"spec": {}, "runs": []}\n')
    line = refused_writing_nothing(tmp_path, "run", task, "--model", "noop", "--out", "c", expected="task")
    assert "campaign.json" not in line
    assert "not a task folder" in line or "is empty" in line
    assert "labkube tasks list" in line


def test_a_task_folder_with_links_outside_it_is_refused_with_the_links_name(tmp_path: Path) -> None:
    task = tmp_path / "task"
    shutil.copytree(TASK_DIR, task)
    (task / "inside.md").symlink_to("task_description.md")  # inside the folder: fine
    (task / "etc").symlink_to("/etc")
    line = refused_writing_nothing(tmp_path, "run", str(task), "--model", "noop", "--out", "c", expected="etc")
    assert "etc is a symbolic link to /etc, outside the task folder" in line
    (task / "etc").unlink()
    (tmp_path / "secret.txt").write_text("the grader's labels\n")
    (task / "data.txt").symlink_to("../secret.txt")
    refused_writing_nothing(
        tmp_path, "run", str(task), "--model", "noop", "--out", "c", expected="data.txt is a symbolic link to"
    )


# -- reading results: report, status, view, export, audit ---------------------------------------------------------


@pytest.mark.parametrize("content", ["", "{\n"], ids=["empty", "corrupt"])
@pytest.mark.parametrize("command", ["report", "status"])
def test_report_and_status_on_a_damaged_campaign_json(tmp_path: Path, command: str, content: str) -> None:
    (tmp_path / "camp").mkdir()
    (tmp_path / "camp" / "campaign.json").write_text(content)
    line = refused_writing_nothing(tmp_path, command, "camp", expected="campaign.json: unreadable")
    assert "pass the --out of a run" in line


@pytest.mark.parametrize("fmt", ["table", "json", "csv", "html"])
def test_report_out_writes_every_format_and_creates_its_folder(copied: Path, tmp_path: Path, fmt: str) -> None:
    target = tmp_path / "missing" / "dir" / f"r.{fmt}"
    proc = labkube("report", str(copied), "--format", fmt, "--out", str(target), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"report written: {target}" in proc.stdout
    text = target.read_text()
    run_id = run_dir(copied).name
    assert (run_id if fmt != "table" else f"({copied.resolve()})") in text  # the table names the campaign
    if fmt == "json":
        assert [r["run_id"] for r in json.loads(text)] == [run_id]
    if fmt in ("json", "csv"):
        assert run_id not in proc.stdout  # in the file, not on the terminal
        shown = labkube("report", str(copied), "--format", fmt, cwd=tmp_path)
        assert shown.stdout == text


def test_view_out_creates_its_folder(copied: Path, tmp_path: Path) -> None:
    target = tmp_path / "missing" / "dir" / "v.html"
    proc = labkube("view", str(run_dir(copied)), "--out", str(target), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert target.read_text().startswith("<!")


@pytest.mark.parametrize("command", ["report", "view"])
def test_report_and_view_out_under_a_regular_file(copied: Path, tmp_path: Path, command: str) -> None:
    (tmp_path / "notes.txt").write_text("mine\n")
    where = str(copied) if command == "report" else str(run_dir(copied))
    args = ["--format", "html"] if command == "report" else []
    before = tree_digest(copied)
    refused_writing_nothing(
        tmp_path, command, where, *args, "--out", "notes.txt/r.html", expected="notes.txt is a file, not a directory"
    )
    refused_writing_nothing(tmp_path, command, where, *args, "--out", ".", expected="--out .: is a directory")
    assert tree_digest(copied) == before


def test_an_empty_result_json_is_no_result_in_report_status_and_analyze(copied: Path, tmp_path: Path) -> None:
    (run_dir(copied) / "result.json").write_text("")
    proc = labkube("report", str(copied), "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(proc.stdout)
    assert row["status"] != "Finished" and row["score"] is None
    assert "result.json is empty or damaged" in row["message"]
    status = labkube("status", str(copied), cwd=tmp_path)
    assert "Finished" not in status.stdout and "Pending" in status.stdout
    analyze = labkube("analyze", str(copied), cwd=tmp_path)
    assert analyze.returncode == 2 and "no run has finished" in analyze.stderr


def test_export_of_a_half_written_campaign_claims_no_folder(copied: Path, tmp_path: Path) -> None:
    (run_dir(copied) / "result.json").unlink()
    proc = labkube("export", str(copied), "--format", "atif", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "0 of 1 runs exported" in proc.stdout
    assert "written:" not in proc.stdout and "nothing written" in proc.stdout
    assert not (copied / "export-atif").exists()


def test_export_min_score_nan_is_refused(copied: Path, tmp_path: Path) -> None:
    before = tree_digest(copied)
    refused_writing_nothing(
        tmp_path, "export", str(copied), "--format", "atif", "--min-score", "nan", expected="--min-score nan"
    )
    assert tree_digest(copied) == before


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--judge-budget-usd", "-3"], "--judge-budget-usd -3.0: give a finite number above 0"),
        (["--judge-budget-usd", "nan"], "--judge-budget-usd nan: give a finite number above 0"),
        (["--inspector-budget-usd", "inf"], "--inspector-budget-usd inf: give a finite number above 0"),
        (["--inspector-model", "openai:gpt-5"], "inspector model openai:gpt-5: OPENAI_API_KEY is not set"),
        (["--judge-model", "openai:gpt-5"], "OPENAI_API_KEY is not set"),
        (["--inspector-model", "anthropic:claude-sonnet-4-5"], "ANTHROPIC_API_KEY is not set"),
    ],
)
def test_audit_refuses_bad_budgets_and_a_missing_key(
    campaign: Path, tmp_path: Path, args: list[str], expected: str
) -> None:
    run = run_dir(campaign)
    before = tree_digest(run)
    proc = labkube("audit", str(run), *args, cwd=tmp_path, env={"OPENAI_API_KEY": "", "ANTHROPIC_API_KEY": ""})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("warning: labkube audit --judge")]
    assert len(lines) == 1 and expected in lines[0], proc.stderr
    assert tree_digest(run) == before


@pytest.fixture
def moved_task(campaign: Path) -> Iterator[Path]:
    task = campaign.parent / "task"
    away = campaign.parent / "task-moved"
    task.rename(away)
    try:
        yield task
    finally:
        away.rename(task)


def test_audit_after_the_task_folder_was_moved(campaign: Path, moved_task: Path, tmp_path: Path) -> None:
    run = run_dir(campaign)
    before = tree_digest(run)
    line = refused(labkube("audit", str(run), cwd=tmp_path), "cannot read the run's task")
    assert str(moved_task) in line
    assert tree_digest(run) == before


# -- Ctrl-C ------------------------------------------------------------------------------------------------------


def test_sigint_marks_unfinished_runs_stopped_and_exits_130(tmp_path: Path) -> None:
    out = tmp_path / "c"
    # An agent that is still working when Ctrl-C comes: the oracle's few seconds could end first on a loaded machine.
    plan = tmp_path / "plan.jsonl"
    step = {"name": "bash", "arguments": {"command": "sleep 120"}}
    plan.write_text(json.dumps({"type": "model_call", "message": {"tool_calls": [step]}}) + "\n")
    model = f"replay:{plan}"
    # As from a terminal: a test session started in the background (`cmd &` in a script, nohup) has SIGINT ignored,
    # and a child keeps that, which would make Ctrl-C nothing to the campaign.
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "labkube", "run", BUNDLED_TASK, "--model", model, "--out", str(out)],
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        cwd=tmp_path,
        env={**os.environ, "RAY_AUTH_MODE": "disabled", "COLUMNS": "200"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        status = out / "runs" / "none-yet" / "status.json"
        while time.monotonic() < deadline and proc.poll() is None:
            found = list((out / "runs").glob("continual-learning-lite--*--s0/status.json"))
            status = found[0] if found else status
            if status.exists() and json.loads(status.read_text() or "{}").get("phase") in ("Starting", "Running"):
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the campaign ended before it could be interrupted"
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "Aborted!" not in stderr
    assert "marked stopped" in stderr and "to resume them, run the same command again" in stderr
    written = json.loads(status.read_text())
    assert written["phase"] == "Pending"
    assert written["message"].startswith("stopped:")
    assert not (status.parent / "result.json").exists()
    # nothing of the run goes on behind the stopped status (an agent left running would finish it)
    record = read_record(status.parent)
    if record is not None:
        assert tagged_pids(record.token) == set()


# -- the command boundary ----------------------------------------------------------------------------------------


def boundary_group(error: Exception) -> click.Group:
    @click.group(cls=FrontDoor)
    def group() -> None:
        pass

    @group.command()
    def fail() -> None:
        raise error

    return group


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (StoreError("/c/campaign.json: unreadable (JSONDecodeError)"), "error: /c/campaign.json: unreadable"),
        (TaskError("task t: no task_description.md in /t"), "error: task t: no task_description.md in /t"),
        (NotADirectoryError(20, "Not a directory", "/etc/hostname/x"), "error: /etc/hostname/x: Not a directory"),
    ],
    ids=["store", "task", "os-on-a-path"],
)
def test_errors_met_later_are_one_line_at_the_command_boundary(error: Exception, expected: str) -> None:
    result = CliRunner().invoke(boundary_group(error), ["fail"])
    assert result.exit_code == 2
    assert result.output.strip() == expected or result.output.strip().startswith(expected), result.output
    assert len(result.output.strip().splitlines()) == 1


def test_a_labkube_bug_prints_its_traceback_and_asks_for_a_report(capsys: pytest.CaptureFixture[str]) -> None:
    result = CliRunner().invoke(boundary_group(ZeroDivisionError("division by zero")), ["fail"])
    assert result.exit_code == 1
    captured = capsys.readouterr()
    shown = result.output + captured.err
    assert "Traceback" in shown and "ZeroDivisionError" in shown
    assert BUG_LINE.split(":")[0] in " ".join(shown.split())


def test_ctrl_c_before_anything_started_exits_130_without_a_traceback() -> None:
    result = CliRunner().invoke(boundary_group(KeyboardInterrupt()), ["fail"])
    assert result.exit_code == 130
    assert "Traceback" not in result.output and "Aborted!" not in result.output
    assert result.output.strip() == "interrupted"
