"""GAIA (v1) datasets in GAIA's layout: loading, read-only attachments, answers scored by the official rules."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from tinytask import make_run_dir

from labkube.agent.harness.entrypoint import run_agent
from labkube.campaign import CampaignSpec, expand_runs
from labkube.tasks import TaskError, resolve_tasks


def dataset(root: Path, rows: list[dict], files: dict[str, str]) -> Path:
    d = root / "gaia-data"
    d.mkdir(parents=True)
    (d / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for name, text in files.items():
        (d / name).write_text(text)
    return d


ROWS = [
    {
        "task_id": "q1",
        "Question": "Sum the numbers in the file.",
        "Level": 1,
        "Final answer": "1250",
        "file_name": "nums.txt",
    },
    {"task_id": "q2", "Question": "Name two colours.", "Level": 2, "Final answer": "red; blue", "file_name": ""},
]


def test_bundled_demo_dataset_loads_every_question() -> None:
    cards = resolve_tasks("gaia/demo")
    assert len(cards) == 8 and {c.gaia.level for c in cards} == {1, 2, 3}
    assert all(c.ref.startswith("gaia/demo/") for c in cards)
    (one,) = resolve_tasks("gaia/demo/demo-factorials")
    assert one.gaia.final_answer == "272"


def test_a_dataset_directory_and_one_question_by_hash(tmp_path: Path) -> None:
    d = dataset(tmp_path, ROWS, {"nums.txt": "1000\n250\n"})
    assert [c.gaia.task_id for c in resolve_tasks(str(d))] == ["q1", "q2"]
    (q2,) = resolve_tasks(f"{d}#q2")
    assert q2.group.endswith("L2")
    spec = CampaignSpec(name="g", tasks=[str(d)], models=["oracle"], seeds=2)
    runs = expand_runs(spec, {str(d): resolve_tasks(str(d))})
    assert len(runs) == 4 and {r.task_id for r in runs} == {"q1", "q2"}


@pytest.mark.parametrize(
    ("rows", "files", "message"),
    [
        ([{"task_id": "x", "Level": 1}], {}, "line 1"),
        ([ROWS[0]], {}, "attachment nums.txt is missing"),
        ([ROWS[1], ROWS[1]], {}, "duplicate task_id"),
    ],
)
def test_malformed_datasets_say_what_is_wrong(tmp_path: Path, rows, files, message) -> None:
    with pytest.raises(TaskError, match=message):
        resolve_tasks(str(dataset(tmp_path, rows, files)))


def test_a_dataset_read_again_after_its_files_change_is_read_afresh(tmp_path: Path) -> None:
    d = dataset(tmp_path, ROWS, {"nums.txt": "1000\n250\n"})

    def age() -> None:  # files written seconds ago, as a campaign's dataset is: the process keeps what it read
        for path in (d / "metadata.jsonl", d):
            os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns - 10**10))

    age()
    assert [c.name for c in resolve_tasks(str(d))] == ["q1", "q2"]
    (d / "metadata.jsonl").write_text(json.dumps(ROWS[1]) + "\n")
    age()
    assert [c.name for c in resolve_tasks(str(d))] == ["q2"]
    (d / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    age()
    assert [c.name for c in resolve_tasks(str(d))] == ["q1", "q2"]
    (d / "nums.txt").unlink()  # only the folder changes
    age()
    with pytest.raises(TaskError, match=r"attachment nums\.txt is missing"):
        resolve_tasks(str(d))


async def run_question(tmp_path: Path, d: Path, task_id: str, answer: str) -> tuple:
    (card,) = resolve_tasks(f"{d}#{task_id}")
    plan_dir = tmp_path / "plan"
    plan_dir.mkdir(parents=True, exist_ok=True)
    transcript = plan_dir / f"{task_id}.jsonl"
    call = {"name": "bash", "arguments": {"command": "cat *.txt 2>/dev/null; touch x 2>&1 | head -1"}}
    end = {"name": "end_task", "arguments": {"summary": answer}}
    transcript.write_text(
        "".join(json.dumps({"type": "model_call", "message": {"tool_calls": [c]}}) + "\n" for c in (call, end))
    )
    run_dir = make_run_dir(tmp_path / task_id, Path(card.path), model=f"replay:{transcript}")
    spec = json.loads((run_dir / "run.json").read_text())
    spec.update(task=card.ref, task_id=task_id)
    (run_dir / "run.json").write_text(json.dumps(spec))
    return await run_agent(run_dir), run_dir


@pytest.mark.parametrize(
    ("answer", "correct"),
    [
        ("I added them. FINAL ANSWER: 1250", True),
        ("FINAL ANSWER: $1,250", True),
        ("FINAL ANSWER: 1,251", False),
    ],
)
async def test_answers_are_scored_by_the_official_rules(tmp_path: Path, answer: str, correct: bool) -> None:
    d = dataset(tmp_path, ROWS, {"nums.txt": "1000\n250\n"})
    result, run_dir = await run_question(tmp_path, d, "q1", answer)
    assert result.score == (1.0 if correct else 0.0) and result.beat_baseline is correct
    attachment = run_dir / "workspace" / "nums.txt"
    assert attachment.read_text() == "1000\n250\n"
    assert not os.access(attachment, os.W_OK) or os.geteuid() == 0
    assert attachment.stat().st_mode & 0o222 == 0  # read-only
    told = [json.loads(x) for x in (run_dir / "conversation.jsonl").read_text().splitlines()]
    assert not any("1250" in m["content"] for m in told if m["role"] in ("system", "user"))  # ground truth unseen


async def test_list_answers(tmp_path: Path) -> None:
    d = dataset(tmp_path, ROWS, {"nums.txt": "1\n"})
    result, _ = await run_question(tmp_path, d, "q2", "FINAL ANSWER: Red, blue")
    assert result.score == 1.0
    result, _ = await run_question(tmp_path / "b", d, "q2", "FINAL ANSWER: red")
    assert result.score == 0.0
