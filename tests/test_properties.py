"""Bad input never produces a traceback or loses earlier results (property-based, hypothesis).

Each section states a property over one kind of input and checks it on many generated
examples: task directories, campaign files (in-process and through the CLI), the Run and
Campaign resource models, V4A patches, model strings, and the agent's tool arguments.

Bugs these properties found are kept as explicit regression cases beside them (`test_*_bugs`,
`test_known_bad_*`); the generators leave those inputs out and say so where they do.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import os
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError
from tinytask import make_tiny_task

from labkube.agent.jobs import JobManager
from labkube.agent.providers.provider import ProviderError
from labkube.agent.providers.registry import make_api_provider
from labkube.agent.rg.apply_patch import PatchError, apply_patch
from labkube.agent.rg.tool import Tool, ToolError
from labkube.agent.rg.tools import ToolContext, research_tools
from labkube.agent.rg.workspace import Workspace
from labkube.campaign import MAX_SEEDS, CampaignSpec, expand_runs
from labkube.cli_checks import UsageFailure
from labkube.model_ref import API_PROVIDERS, KNOWN, ModelRef, UnknownModel, parse_model
from labkube.operator import k8s_models as km
from labkube.operator.crds import API_VERSION, SchemaError, campaign_crd, campaign_resource_spec, run_crd
from labkube.operator.crds import validate_resource as crd_validate
from labkube.run_spec import RunSpec
from labkube.runs_cli import load_campaign_file
from labkube.store import CampaignDir, write_json_atomic
from labkube.task_card import LabkubeYaml, Subtask, TaskCard
from labkube.tasks import TaskError, prepare_run_workspace, resolve_tasks

CI = settings(
    deadline=None,
    max_examples=60,
    database=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.data_too_large,
    ],
)


# -- shared strategies and helpers ---------------------------------------------------------------

# JSON as a model or a user writes it: no NaN/infinity (JSON has none), no lone surrogates
# (hypothesis leaves them out of text by default).
json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
)
json_values = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
# Names and free text without control characters, markup brackets or line breaks (see the
# CLI regression cases for what those once did to an error line).
plain_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp"), blacklist_characters="[]"),
    max_size=16,
)
identifier = st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True)
# JSON whose strings an error message may echo safely: see plain_text.
plain_json = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False), plain_text),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(plain_text, inner, max_size=3),
    max_leaves=8,
)


def mostly(common: st.SearchStrategy[Any], rare: st.SearchStrategy[Any], odds: int = 3) -> st.SearchStrategy[Any]:
    """`common` `odds` times as often as `rare` (st.one_of would weigh repeated branches once)."""
    return st.integers(0, odds).flatmap(lambda i: rare if i == 0 else common)


def maybe(valid: st.SearchStrategy[Any], junk: st.SearchStrategy[Any] = json_values) -> st.SearchStrategy[Any]:
    """Mostly a plausible value, sometimes any JSON value."""
    return mostly(valid, junk)


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under `root` (not following symlinks): kind, content or target, and mode."""
    out: dict[str, tuple] = {}
    if not root.exists():
        return out
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            p = Path(dirpath) / name
            st_ = os.lstat(p)
            rel = p.relative_to(root).as_posix()
            if stat.S_ISLNK(st_.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISDIR(st_.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st_.st_mode))
            else:
                out[rel] = ("file", p.read_bytes(), stat.S_IMODE(st_.st_mode))
    return out


@contextmanager
def scratch() -> Iterator[Path]:
    """A fresh directory per hypothesis example."""
    with tempfile.TemporaryDirectory(prefix="labkube-prop-") as d:
        yield Path(d).resolve()


def dump(data: Any) -> str:
    return yaml.safe_dump(data, allow_unicode=True, sort_keys=False)


def same_json(a: BaseModel, b: BaseModel) -> bool:
    return json.dumps(a.model_dump(mode="json"), sort_keys=True) == json.dumps(
        b.model_dump(mode="json"), sort_keys=True
    )


# -- task cards ----------------------------------------------------------------------------------

METRIC_HEADERS = [
    "Acc ↑",
    "Loss ↓",
    "F1 (higher is better)",
    "RMSE (lower is better)",
    "ImageNet-R (N = 5) Acc ↑ AAA ↑",
    "**Top-1** ↑",
    "Score",
    "↑",
    "↓ ↑ ↓",
    "",
]
CELLS = ["--", "81.2 (0.3)", "1e999", "-1e999", "nan", "±0.1", "1,234.5", "80.1 (0.3) 85.2 (0.1)", "", "**3.5**", "x"]
METHODS = ["Your Method", "**Your Method**", "your method", "Baseline", "Ours", ""]
cell_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="|\n\r"), max_size=10)


@st.composite
def markdown_table(draw: st.DrawFn) -> str:
    ncols = draw(st.integers(1, 5))
    header = ["Method"] + [draw(st.sampled_from(METRIC_HEADERS) | cell_text) for _ in range(ncols - 1)]
    sep_cell = draw(st.sampled_from(["---", ":--", "--:", ":-:", "-", "abc", "- -"]))
    sep_count = draw(st.sampled_from([ncols, ncols, ncols, ncols + 1, max(1, ncols - 1)]))
    rows = []
    for _ in range(draw(st.integers(0, 4))):
        width = draw(st.sampled_from([ncols, ncols, ncols, ncols + 1, max(0, ncols - 1)]))
        first = draw(st.sampled_from(METHODS) | cell_text)
        rows.append([first] + [draw(st.sampled_from(CELLS) | cell_text) for _ in range(max(0, width - 1))])
    outer = draw(st.booleans())

    def line(cells: list[str]) -> str:
        body = " | ".join(cells)
        return f"| {body} |" if outer else f"|{body}"

    return "\n".join([line(header), line([sep_cell] * sep_count), *(line(r) for r in rows)])


markdown = st.lists(st.one_of(markdown_table(), st.text(max_size=40)), max_size=4).map("\n\n".join)

subtask_dict = st.fixed_dictionaries(
    {"id": maybe(st.from_regex(r"[A-Za-z0-9_.\-]{1,8}", fullmatch=True)), "metric": maybe(plain_text)},
    optional={
        "direction": maybe(st.sampled_from(["higher", "lower", "sideways"])),
        "baseline": maybe(st.floats(allow_nan=False, allow_infinity=False)),
        "sota": maybe(st.floats(allow_nan=False, allow_infinity=False)),
        "primary": maybe(st.booleans()),
        "json_key": maybe(plain_text),
        "table": maybe(st.integers(-1, 3)),
        "column": maybe(st.sampled_from(METRIC_HEADERS)),
        "part": maybe(st.integers(-1, 3)),
    },
)
small_num = st.one_of(st.none(), st.integers(-2, 100), st.floats(-2, 1e6, allow_nan=False))
labkube_yaml_dict = st.fixed_dictionaries(
    {},
    optional={
        "name": maybe(plain_text),
        "subtasks": maybe(st.lists(subtask_dict, max_size=3)),
        "resources": maybe(
            st.fixed_dictionaries(
                {},
                optional={
                    "gpus": maybe(st.integers(-1, 8)),
                    "cpus": maybe(small_num),
                    "memory_gb": maybe(small_num),
                    "image": maybe(plain_text),
                    "node_selector": maybe(st.dictionaries(plain_text, plain_text, max_size=2)),
                },
            )
        ),
        "budgets": maybe(
            st.fixed_dictionaries({}, optional={k: maybe(small_num) for k in ("wall_hours", "tokens", "usd", "steps")})
        ),
        "grading": maybe(
            st.fixed_dictionaries(
                {},
                optional={
                    "command": maybe(plain_text),
                    "summary": maybe(plain_text),
                    "timeout_s": maybe(small_num),
                    "interval_s": maybe(small_num),
                },
            )
        ),
        "protected": maybe(st.lists(plain_text, max_size=3)),
        "hidden": maybe(st.lists(plain_text, max_size=3)),
        "oracle": maybe(plain_text),
        "heldout": maybe(st.lists(plain_text, max_size=2)),
        "required_seeds": maybe(st.lists(st.integers(-1, 10), max_size=3)),
        "seeds_json_key": maybe(plain_text),
        "baseline_check": maybe(plain_text),
        "surprise": json_values,
    },
)


@st.composite
def broken_yaml(draw: st.DrawFn, source: st.SearchStrategy[Any]) -> str:
    """A YAML dump with a random slice replaced: tabs, stray quotes, cut mappings."""
    text = dump(draw(source))
    i = draw(st.integers(0, len(text)))
    j = draw(st.integers(i, min(len(text), i + 8)))
    return (
        text[:i]
        + draw(st.sampled_from(["", "\t", ":", "'", '"', "- ", "{", "&a", "*a", "!!binary", "\n  "]))
        + text[j:]
    )


def yaml_text(source: st.SearchStrategy[Any], noise: st.SearchStrategy[str] | None = None) -> st.SearchStrategy[str]:
    noise = st.text(max_size=60) if noise is None else noise
    return mostly(source.map(dump), st.one_of(broken_yaml(source), noise), odds=1)


@st.composite
def task_dir_files(draw: st.DrawFn) -> dict[str, str | bytes]:
    files: dict[str, str | bytes] = {"task_description.md": draw(markdown)}
    if draw(st.booleans()):
        files["labkube.yaml"] = draw(yaml_text(labkube_yaml_dict))
    if draw(st.booleans()):
        files["blocked_urls.yaml"] = draw(
            yaml_text(st.one_of(st.lists(plain_text, max_size=3), st.dictionaries(plain_text, json_values, max_size=2)))
        )
    if draw(st.booleans()):
        files["grading/grade.sh"] = "echo graded\n"
    return files


def write_files(root: Path, files: dict[str, str | bytes]) -> Path:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
    return root


def load_or_task_error(task: Path) -> list[TaskCard] | None:
    """The cards, or None on a TaskError; any other exception fails the test."""
    try:
        return resolve_tasks(str(task))
    except TaskError as exc:
        assert str(exc).strip(), "a TaskError must say what is wrong"
        return None


@CI
@given(data=labkube_yaml_dict)
def test_labkube_yaml_validates_or_raises_validation_error(data: dict[str, Any]) -> None:
    try:
        card = LabkubeYaml.model_validate(data)
    except ValidationError:
        return
    assert same_json(LabkubeYaml.model_validate_json(card.model_dump_json()), card)
    if card.subtasks:
        assert sum(s.primary for s in card.subtasks) == 1
        assert len({s.id for s in card.subtasks}) == len(card.subtasks)


@settings(CI, max_examples=80)
@given(files=task_dir_files())
def test_task_directory_loads_with_warnings_or_raises_task_error(files: dict[str, str | bytes]) -> None:
    with scratch() as tmp:
        task = write_files(tmp / "task", files)
        cards = load_or_task_error(task)
        if cards is None:
            return
        (card,) = cards
        assert card.path == str(task)
        for s in card.subtasks:
            Subtask.model_validate(s.model_dump())  # ids and fields are valid
        if card.subtasks:
            assert sum(s.primary for s in card.subtasks) == 1
        assert {"labkube.yaml", "install.sh", "requirements.txt", "idea_hint.txt"} <= set(card.hidden)


@CI
@given(md=st.binary(max_size=400))
def test_random_bytes_as_task_description_load_with_warnings_or_are_refused_as_not_text(md: bytes) -> None:
    """Text loads, with warnings for what it lacks; bytes that are not text, or nothing, are one TaskError (issue
    45: a run on them would have nothing to read)."""
    try:
        text = md.decode("utf-8")
    except UnicodeDecodeError:
        text = "\0"
    with scratch() as tmp:
        task = write_files(tmp / "task", {"task_description.md": md})
        if "\0" not in text and text.strip():
            assert load_or_task_error(task) is not None
            return
        with pytest.raises(TaskError, match=r"task_description\.md is (not text|empty)"):
            resolve_tasks(str(task))


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(
            "labkube.yaml",
        ),
        pytest.param(
            "blocked_urls.yaml",
        ),
    ],
)
@CI
@example(content=b"\xff\xfe\x80 not utf-8")
@given(content=st.binary(max_size=200).map(lambda b: b"\xff" + b))
def test_random_bytes_in_task_yaml_are_task_errors(name: str, content: bytes) -> None:
    with scratch() as tmp:
        task = write_files(tmp / "task", {"task_description.md": "# t\n", name: content})
        load_or_task_error(task)


@CI
@given(table=markdown_table())
@example(table="| Method | Acc ↑ | Acc ↑ |\n|---|---|---|\n| Base | 1 | 2 |\n| Your Method | -- | -- |")
def test_inferred_subtask_ids_are_distinct(table: str) -> None:
    assume("\0" not in table)  # a NUL makes it binary, refused as such (test_random_bytes_as_task_description_...)
    with scratch() as tmp:
        task = write_files(tmp / "task", {"task_description.md": table})
        cards = load_or_task_error(task)
        assert cards is not None
        ids = [s.id for s in cards[0].subtasks]
        assert len(ids) == len(set(ids)), ids


def _make_dir(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.mkdir()


@pytest.mark.parametrize(
    ("name", "make"),
    [
        pytest.param(
            "labkube.yaml",
            _make_dir,
            id="labkube.yaml-is-a-directory",
        ),
        pytest.param(
            "task_description.md",
            _make_dir,
            id="task_description.md-is-a-directory",
        ),
        pytest.param(
            "blocked_urls.yaml",
            _make_dir,
            id="blocked_urls.yaml-is-a-directory",
        ),
        pytest.param(
            "labkube.yaml",
            lambda p: p.write_text("a: " + "[" * 1500 + "]" * 1500),
            id="deeply-nested-labkube.yaml",
        ),
        pytest.param("labkube.yaml", lambda p: os.symlink("labkube.yaml", p), id="labkube.yaml-symlink-loop"),
        pytest.param("labkube.yaml", lambda p: p.write_text("name: !!python/object:os.system x\n"), id="yaml-tag"),
    ],
)
def test_unreadable_task_files_are_task_errors(name: str, make: Callable[[Path], None]) -> None:
    with scratch() as tmp:
        task = write_files(tmp / "task", {"task_description.md": "# t\n"})
        make(task / name)
        load_or_task_error(task)


gaia_row = st.fixed_dictionaries(
    {
        "task_id": maybe(st.from_regex(r"[a-z0-9-]{1,8}", fullmatch=True)),
        "Question": maybe(plain_text),
        "Level": maybe(st.integers(0, 4)),
        "Final answer": maybe(plain_text),
    },
    # Attachments stay inside the dataset here; see test_gaia_attachments_stay_inside_the_workspace.
    optional={"file_name": maybe(st.sampled_from(["", "att.txt", "missing.txt", "sub/att.txt", "sub"]))},
)
gaia_line = mostly(gaia_row.map(json.dumps), st.one_of(json_values.map(json.dumps), plain_text), odds=2)


@CI
@given(lines=st.lists(gaia_line, max_size=4))
def test_gaia_dataset_loads_or_raises_task_error(lines: list[str]) -> None:
    with scratch() as tmp:
        ds = write_files(tmp / "ds", {"metadata.jsonl": "\n".join(lines), "att.txt": "a", "sub/att.txt": "b"})
        cards = load_or_task_error(ds)
        for card in cards or []:
            assert card.gaia is not None
            if card.gaia.file_name:
                assert (ds / card.gaia.file_name).resolve().is_relative_to(ds)


def test_random_bytes_in_gaia_metadata_are_task_errors() -> None:
    with scratch() as tmp:
        ds = write_files(tmp / "ds", {"metadata.jsonl": b"\xff\xfe{}\n"})
        load_or_task_error(ds)


@pytest.mark.parametrize("escape", ["../victim.txt", "ABSOLUTE"])
def test_gaia_attachments_stay_inside_the_workspace(escape: str) -> None:
    with scratch() as tmp:
        victim = tmp / "victim.txt"
        victim.write_text("not yours\n")
        file_name = str(victim) if escape == "ABSOLUTE" else escape
        row = {"task_id": "q1", "Question": "?", "Level": 1, "Final answer": "1", "file_name": file_name}
        ds = write_files(tmp / "ds", {"metadata.jsonl": json.dumps(row)})
        run = tmp / "run"
        run.mkdir()
        before_tmp, before_run = snapshot(tmp), snapshot(run)
        cards = load_or_task_error(ds)
        for card in cards or []:
            prepare_run_workspace(card, run / "workspace")
        after = {k: v for k, v in snapshot(tmp).items() if not k.startswith("run/")}
        assert after == {k: v for k, v in before_tmp.items() if not k.startswith("run/")}
        assert {k for k in snapshot(run) if not k.startswith("workspace")} == set(before_run)


# -- campaign files ------------------------------------------------------------------------------

MODELS = [
    "oracle",
    "noop",
    "openai:gpt-5",
    "anthropic:claude-sonnet-4-5",
    "openai-compatible:http://h:8000/v1#m",
    "replay:/x",
    "bogus",
    "openai:",
]
nonexistent_task = st.one_of(
    st.sampled_from(["researchgym/no-such-task", "gaia/none", "./missing", "missing/dir#q1", "nope"]),
    st.from_regex(r"[a-z]{1,8}/[a-z]{1,8}", fullmatch=True),
)
num = st.one_of(st.none(), st.floats(min_value=-10, max_value=1e6, allow_nan=False), st.integers(-5, 10**6))


def campaign_fields(junk: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """A campaign file's mapping: plausible values, sometimes `junk` instead."""

    def m(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        return maybe(valid, junk)

    return st.fixed_dictionaries(
        {"tasks": m(st.lists(nonexistent_task, max_size=3))},
        optional={
            "name": m(st.from_regex(r"[a-z0-9]([a-z0-9.-]{0,10}[a-z0-9])?", fullmatch=True)),
            "models": m(st.lists(st.sampled_from(MODELS), max_size=3)),
            # Seed counts stay small: a huge count is pinned by test_huge_seed_count_is_rejected.
            "seeds": m(st.one_of(st.integers(-2, 20), st.lists(st.integers(-2, 50), max_size=4))),
            "budgets": m(
                st.fixed_dictionaries({}, optional={k: num for k in ("wall_hours", "tokens", "usd", "steps")})
            ),
            "concurrency": m(st.integers(-1, 20_000)),
            "gpu_hours_cap": m(num),
            "idea_hint": m(st.booleans()),
            "grade_interval_s": m(num),
            "prices": m(st.dictionaries(st.sampled_from(MODELS), st.lists(st.floats(0, 100), max_size=4), max_size=2)),
            "backend": m(st.sampled_from(["local", "k8s", "slurm"])),
            "context_threshold": m(num),
            "judge_model": m(st.none() | st.sampled_from(MODELS)),
            "inspector_model": m(st.none() | st.sampled_from(MODELS)),
            "inspector_budget_usd": m(num),
            "api_key_env": m(st.dictionaries(st.sampled_from(MODELS), identifier, max_size=2)),
            "surprise": junk,
        },
    )


def resource_form(spec: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    return st.builds(
        lambda name, spec: {"apiVersion": API_VERSION, "kind": "Campaign", "metadata": {"name": name}, "spec": spec},
        st.from_regex(r"[a-z][a-z0-9-]{0,8}", fullmatch=True),
        spec,
    )


campaign_dict = campaign_fields(json_values)
campaign_file_text = st.one_of(yaml_text(campaign_dict), resource_form(campaign_dict).map(dump))
# For the CLI, whose one error line may echo keys and values: no line breaks or markup brackets
# (pinned by test_known_bad_campaign_files_through_the_cli).
plain_campaign_dict = campaign_fields(plain_json)
cli_campaign_file_text = st.one_of(
    yaml_text(plain_campaign_dict, noise=plain_text), resource_form(plain_campaign_dict).map(dump)
)


@settings(CI, max_examples=150)
@given(data=campaign_dict)
def test_campaign_spec_validates_or_raises_validation_error(data: dict[str, Any]) -> None:
    try:
        spec = CampaignSpec.model_validate(data)
    except ValidationError:
        return
    again = CampaignSpec.model_validate_json(json.dumps(spec.model_dump(mode="json")))
    assert same_json(again, spec)
    assert len(spec.seed_list) == len(set(spec.seed_list)) >= 1


@settings(CI, max_examples=100)
@given(text=campaign_file_text)
def test_campaign_file_loads_or_is_a_usage_failure(text: str) -> None:
    with scratch() as tmp:
        path = tmp / "campaign.yaml"
        path.write_text(text, encoding="utf-8")
        try:
            spec = load_campaign_file(path)
        except UsageFailure as exc:
            assert exc.exit_code == 2 and exc.message.strip()
            return
        assert isinstance(spec, CampaignSpec)


@settings(CI, max_examples=100)
@given(data=campaign_dict)
def test_an_accepted_campaign_is_compatible_with_its_own_directory(data: dict[str, Any]) -> None:
    """Re-running a campaign file resumes its directory instead of calling it a different campaign."""
    try:
        spec = CampaignSpec.model_validate(data)
    except ValidationError:
        return
    if any(math.isnan(x) for prices in spec.prices.values() for x in prices):
        return  # pinned by test_nan_price_campaign_can_resume
    with scratch() as tmp:
        cdir = CampaignDir(tmp / "camp")
        cdir.write_campaign(spec, [])
        cdir.check_compatible(spec)


def test_nan_price_is_rejected_so_a_campaign_can_always_resume() -> None:
    # A NaN never equals itself: a campaign holding one could never be recognised to resume it.
    with pytest.raises(ValidationError, match="non-negative numbers"):
        CampaignSpec.model_validate({"tasks": ["t"], "prices": {"oracle": [float("nan"), 1.0]}})


@pytest.mark.parametrize(
    ("seeds", "message"),
    [
        (10**20, f"seeds must be between 1 and {MAX_SEEDS}"),
        (MAX_SEEDS + 1, f"seeds must be between 1 and {MAX_SEEDS}"),
        (list(range(MAX_SEEDS + 1)), f"at most {MAX_SEEDS} seeds"),
    ],
)
def test_huge_seed_count_is_rejected(seeds: int | list[int], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        CampaignSpec.model_validate({"tasks": ["t"], "seeds": seeds})


def test_largest_seed_count_is_accepted() -> None:
    spec = CampaignSpec.model_validate({"tasks": ["t"], "seeds": MAX_SEEDS})
    assert spec.seed_list == list(range(MAX_SEEDS))


# Through the CLI: a bad campaign file exits 2 with one line on stderr and leaves an existing
# campaign directory byte-identical. Few examples: each spawns `labkube`.


@pytest.fixture(scope="module")
def existing_campaign(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("existing")
    task = make_tiny_task(work, [])
    spec = CampaignSpec(name="existing", tasks=[str(task)], models=["noop"], seeds=2)
    cards = {str(task): resolve_tasks(str(task))}
    cdir = CampaignDir(work / "camp")
    runs = expand_runs(spec, cards)
    cdir.write_campaign(spec, runs)
    for run in runs:
        rd = cdir.run_dir(run.run_id)
        (rd / "transcript.jsonl").write_text('{"type": "start"}\n')
        write_json_atomic(rd / "status.json", {"run_id": run.run_id, "phase": "Finished"})
        (rd / "workspace").mkdir()
        (rd / "workspace" / "result.txt").write_text("5\n")
    return cdir.root


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "COLUMNS": "200"}
    env.pop("OPENAI_API_KEY", None)
    env.pop("ANTHROPIC_API_KEY", None)
    return subprocess.run(
        [sys.executable, "-P", "-m", "labkube", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def assert_bad_file_rejected(content: str | bytes | None, existing: Path) -> None:
    """`content` None: FILE is a directory."""
    before = snapshot(existing)
    with scratch() as tmp:
        path = tmp / "campaign.yaml"
        if content is None:
            path.mkdir()
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
        proc = run_cli("campaign", "run", str(path), "--out", str(existing), cwd=tmp)
        assert snapshot(existing) == before, "the existing campaign directory changed"
        assert sorted(p.name for p in tmp.iterdir()) == ["campaign.yaml"], "something was written"
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-2000:]
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].strip(), proc.stderr


@pytest.mark.slow
@settings(CI, max_examples=15)
@given(text=cli_campaign_file_text)
def test_bad_campaign_file_through_the_cli_exits_2_and_keeps_the_campaign(text: str, existing_campaign: Path) -> None:
    assert_bad_file_rejected(text, existing_campaign)


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(
            b"tasks: [x]\n\xff\xfe\n",
            id="random-bytes",
        ),
        pytest.param(
            None,
            id="file-is-a-directory",
        ),
        pytest.param(
            "kind: Campaign\nmetadata: [a]\nspec: {tasks: [x]}\n",
            id="metadata-not-a-mapping",
        ),
        pytest.param(
            "kind: Campaign\nmetadata: {name: a}\nspec:\n",
            id="spec-not-a-mapping",
        ),
        pytest.param(
            "tasks: [x]\nbudgets: " + "[" * 1500 + "]" * 1500 + "\n",
            id="deeply-nested",
        ),
        pytest.param("kind: Campaign\nmetadata: {name: a}\nspec: {tasks: []}\n", id="resource-without-tasks"),
    ],
)
def test_known_bad_campaign_files_are_usage_failures(content: str | bytes | None) -> None:
    with scratch() as tmp:
        path = tmp / "campaign.yaml"
        if content is None:
            path.mkdir()
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
        with pytest.raises(UsageFailure):
            load_campaign_file(path)


TINY = "TINY_TASK"


@pytest.mark.slow
@pytest.mark.parametrize(
    "content",
    [
        pytest.param(
            b"tasks: [x]\n\xff\xfe\n",
            id="random-bytes",
        ),
        pytest.param(
            f"tasks: [{TINY}]\nmodels: [noop]\nseeds: 100000000000000000000\n",
            id="huge-seed-count",
        ),
        pytest.param(
            'tasks: ["[/x]"]\n',
            id="markup-in-task-name",
        ),
        pytest.param(
            'tasks: [x]\n"a\\nb": 1\n',
            id="line-break-in-key",
        ),
        pytest.param("tasks: [x]\nseeds: -1\n", id="negative-seeds"),
    ],
)
def test_known_bad_campaign_files_through_the_cli(content: str | bytes, existing_campaign: Path) -> None:
    if isinstance(content, str) and TINY in content:
        content = content.replace(TINY, str(existing_campaign.parent / "tiny-task"))
    assert_bad_file_rejected(content, existing_campaign)


# -- Run and Campaign resources ------------------------------------------------------------------

CONDITION = {
    "type": "Ready",
    "status": "True",
    "reason": "Running",
    "message": "m",
    "lastTransitionTime": "2024-01-01T00:00:00Z",
    "observedGeneration": 1,
}
CAMPAIGN = {
    "name": "c1",
    "tasks": ["researchgym/x"],
    "models": ["oracle", "openai:gpt-5"],
    "seeds": [0, 2],
    "budgets": {"wall_hours": 1, "usd": 5},
    "concurrency": 2,
    "gpu_hours_cap": 3,
    "idea_hint": True,
    "grade_interval_s": 60,
    "prices": {"openai:gpt-5": [1.25, 10]},
    "backend": "local",
    "context_threshold": 1000,
    "judge_model": "openai:gpt-5",
    "inspector_model": "openai:gpt-5",
    "inspector_budget_usd": 2,
    "api_key_env": {"openai:gpt-5": "OPENAI_API_KEY"},
}
RUN = {
    "run_id": "x--oracle--s0",
    "campaign": "c1",
    "task": "researchgym/x",
    "task_path": "/tasks/x",
    "model": "oracle",
    "seed": 0,
    "budgets": {"steps": 5},
    "gpus": 1,
    "prices": {"oracle": [0, 0]},
    "api_key_env": {},
}
POD = {
    "nodeSelector": {"gpu": "a100"},
    "tolerations": [{"key": "k", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 5}],
    "priorityClassName": "research",
    "queueName": "q",
}
EXAMPLES: dict[type[BaseModel], dict[str, Any]] = {
    CampaignSpec: CAMPAIGN,
    RunSpec: RUN,
    km.CampaignResourceSpec: {**{k: v for k, v in CAMPAIGN.items() if k != "name"}, "backend": "k8s", "pod": POD},
    km.RunResourceSpec: {
        **RUN,
        "family": "researchgym",
        "resources": {"gpus": 1, "cpus": 2, "memory_gb": 8, "image": "img", "node_selector": {"a": "b"}},
        "pod": POD,
    },
    km.RunStatus: {
        "phase": "Running",
        "podName": "p",
        "attempts": 1,
        "score": 0.5,
        "tokens": 10,
        "costUsd": 0.1,
        "gpuHours": 0.2,
        "stopReason": "done",
        "observedGeneration": 1,
        "conditions": [CONDITION],
    },
    km.CampaignStatus: {
        "phase": "Running",
        "runs": {"total": 2, "running": 1, "finished": 1},
        "progress": "1/2",
        "gpuHoursUsed": 0.5,
        "observedGeneration": 2,
        "conditions": [CONDITION],
    },
    km.OperatorConfig: {
        "namespaces": ["a"],
        "logLevel": "info",
        "metricsPort": 8080,
        "healthPort": 8081,
        "runs": {
            "defaultImage": "img",
            "env": {"FOO": "bar"},
            "apiKeys": [{"env": "OPENAI_API_KEY", "secretName": "s", "key": "k"}],
            "workspace": {"mode": "pvc", "size": "10Gi"},
            "world": {"image": "w", "port": 8765, "resources": {"requests": {"cpu": "500m"}}},
            "tolerations": [{"operator": "Exists"}],
        },
    },
}


@st.composite
def mutated(draw: st.DrawFn, value: Any, depth: int = 0) -> Any:
    """`value` with a few random edits at random places: a key dropped, replaced or added."""
    if isinstance(value, dict) and value and depth < 4 and draw(st.integers(0, 3)):
        out = dict(value)
        key = draw(st.sampled_from(sorted(out)))
        action = draw(st.sampled_from(["descend", "descend", "drop", "replace"]))
        if action == "descend":
            out[key] = draw(mutated(out[key], depth + 1))
        elif action == "drop":
            del out[key]
        else:
            out[key] = draw(json_values)
        if draw(st.integers(0, 5)) == 0:
            out[draw(st.text(max_size=8))] = draw(json_values)
        return out
    if isinstance(value, list) and value and depth < 4 and draw(st.booleans()):
        out_list = list(value)
        i = draw(st.integers(0, len(out_list) - 1))
        out_list[i] = draw(mutated(out_list[i], depth + 1))
        return out_list
    if draw(st.integers(0, 2)) == 0:
        return draw(json_values)
    return value


@functools.cache
def crds() -> tuple[dict[str, Any], dict[str, Any]]:
    return campaign_crd(), run_crd()


def check_against_crd(model: BaseModel) -> None:
    """What pydantic accepts, written canonically, the CRD's schema accepts too."""
    campaign, run = crds()
    if isinstance(model, km.CampaignResourceSpec):
        spec = model.model_dump(mode="json", exclude={"name"}, exclude_none=True)
        crd_validate({"apiVersion": API_VERSION, "kind": "Campaign", "metadata": {"name": "c"}, "spec": spec}, campaign)
        assert isinstance(model.to_campaign_spec(), CampaignSpec)
    elif isinstance(model, km.RunResourceSpec):
        spec = model.model_dump(mode="json", exclude_none=True)
        crd_validate({"apiVersion": API_VERSION, "kind": "Run", "metadata": {"name": "r"}, "spec": spec}, run)
        assert isinstance(model.to_run_spec(), RunSpec)
    elif isinstance(model, km.RunStatus | km.CampaignStatus):
        is_run = isinstance(model, km.RunStatus)
        base = EXAMPLES[km.RunResourceSpec if is_run else km.CampaignResourceSpec]
        crd_validate(
            {
                "apiVersion": API_VERSION,
                "kind": "Run" if is_run else "Campaign",
                "metadata": {"name": "x"},
                "spec": base,
                "status": model.to_status(),
            },
            run if is_run else campaign,
        )


@pytest.mark.parametrize("model", list(EXAMPLES), ids=lambda m: m.__name__)
def test_resource_examples_are_valid(model: type[BaseModel]) -> None:
    check_against_crd(model.model_validate(EXAMPLES[model]))


@pytest.mark.parametrize("model", list(EXAMPLES), ids=lambda m: m.__name__)
@settings(CI, max_examples=50)
@given(data=st.data())
def test_resource_models_validate_or_raise_validation_error(model: type[BaseModel], data: st.DataObject) -> None:
    value = data.draw(mutated(EXAMPLES[model]))
    try:
        obj = model.model_validate(value)
    except ValidationError:
        return
    again = model.model_validate_json(json.dumps(obj.model_dump(mode="json")))
    assert same_json(again, obj)
    check_against_crd(obj)


@settings(CI, max_examples=80)
@given(spec=mutated(EXAMPLES[km.CampaignResourceSpec]), name=st.one_of(st.just("camp"), json_values))
def test_campaign_resource_reads_or_raises_validation_or_schema_error(spec: Any, name: Any) -> None:
    obj = {"apiVersion": API_VERSION, "kind": "Campaign", "metadata": {"name": name}, "spec": spec}
    if not isinstance(spec, dict):
        return  # the API server has already checked that spec is an object
    try:
        read = campaign_resource_spec(obj)
    except (ValidationError, SchemaError):
        return
    assert isinstance(read.to_campaign_spec(), CampaignSpec)


# -- V4A patches ---------------------------------------------------------------------------------

TREE = {
    "a.txt": "alpha\nbeta\ngamma\ndelta\n",
    "src/m.py": "def f():\n    return 1\n\n\nclass C:\n    def g(self):\n        return 2\n",
    "crlf.txt": "one\r\ntwo\r\n",
    "nonl.txt": "last line",
    "empty.txt": "",
    "d/b.txt": "b\n",
}


def make_patch_tree(base: Path) -> Path:
    root = base / "ws"
    for rel, text in TREE.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(text.encode())
    (root / "bin.dat").write_bytes(b"\xff\xfe\x00")
    (base / "outside").mkdir()
    (base / "outside" / "secret.txt").write_text("outside secret\n")
    (base / "outside_file.txt").write_text("outside file\n")
    os.symlink(base / "outside", root / "out")
    os.symlink(base / "outside_file.txt", root / "outfile")
    os.symlink(base / "nope.txt", root / "dangling")
    return root


def outside_of(base: Path) -> dict[str, tuple]:
    return {k: v for k, v in snapshot(base).items() if not (k == "ws" or k.startswith(("ws/", "jobs")))}


# Paths under a regular file ("a.txt/x"), NUL bytes, over-long names and symlink loops are
# left out: test_patch_bugs pins what they do.
patch_paths = st.one_of(
    st.sampled_from(
        [
            "a.txt",
            "src/m.py",
            "crlf.txt",
            "nonl.txt",
            "empty.txt",
            "d/b.txt",
            "bin.dat",
            "d",
            ".",
            "new.txt",
            "d/new.txt",
            "e/f/new.txt",
            "./a.txt",
            "d/../a.txt",
            "../x.txt",
            "../outside/secret.txt",
            "OUTSIDE_ABS",
            "out/secret.txt",
            "out/new.txt",
            "outfile",
            "dangling",
            "out",
            "a.txt ",
        ]
    ),
    st.text(alphabet="abcxyz._- ", min_size=1, max_size=10),
)
line_text = st.text(alphabet=st.characters(blacklist_characters="\n\r", blacklist_categories=("Cs",)), max_size=12)


@st.composite
def hunk(draw: st.DrawFn, lines: list[str]) -> list[str]:
    body: list[str] = []
    headers = draw(
        st.sampled_from([[], [], ["@@"], ["@@ -1,3 +1,4 @@"], ["@@ " + (lines[0] if lines else "x")], ["@@ nowhere"]])
    )
    if lines and draw(st.integers(0, 3)):
        i = draw(st.integers(0, len(lines) - 1))
        j = draw(st.integers(i, min(len(lines), i + 4)))
        for old in lines[i:j]:
            kind = draw(st.sampled_from([" ", " ", "-"]))
            text = (
                old if draw(st.integers(0, 6)) else draw(st.sampled_from([old + "  ", old.strip(), "  " + old, "zz"]))
            )
            body.append(kind + text)
            if draw(st.integers(0, 2)) == 0:
                body.append("+" + draw(line_text))
    else:
        body = draw(st.lists(st.tuples(st.sampled_from(" -+"), line_text).map("".join), max_size=4))
    if draw(st.integers(0, 4)) == 0:
        body.append("*** End of File")
    return headers + body


@st.composite
def file_op(draw: st.DrawFn) -> list[str]:
    path = draw(patch_paths)
    kind = draw(st.sampled_from(["add", "delete", "update", "update", "update"]))
    if kind == "add":
        return [f"*** Add File: {path}", *("+" + t for t in draw(st.lists(line_text, max_size=3)))]
    if kind == "delete":
        return [f"*** Delete File: {path}"]
    lines = TREE.get(path.strip().removeprefix("./"), "").replace("\r\n", "\n").splitlines()
    out = [f"*** Update File: {path}"]
    if draw(st.integers(0, 3)) == 0:
        out.append(f"*** Move to: {draw(patch_paths)}")
    for _ in range(draw(st.integers(0, 2))):
        out.extend(draw(hunk(lines)))
    return out


@st.composite
def near_valid_patch(draw: st.DrawFn) -> str:
    lines = ["*** Begin Patch"]
    for op in draw(st.lists(file_op(), min_size=0, max_size=3)):
        lines.extend(op)
        if draw(st.integers(0, 4)) == 0:
            lines.append("")
    lines.append("*** End Patch")
    mangle = draw(st.sampled_from(["keep"] * 17 + ["drop_begin", "drop_end", "drop_line"]))
    if mangle == "drop_begin":
        lines = lines[1:]
    elif mangle == "drop_end":
        lines = lines[:-1]
    elif mangle == "drop_line" and len(lines) > 2:
        del lines[draw(st.integers(1, len(lines) - 2))]
    eol = draw(st.sampled_from(["\n", "\n", "\r\n"]))
    return eol.join(lines) + draw(st.sampled_from(["", eol]))


V4A_LINES = [
    "*** Begin Patch",
    "*** End Patch",
    "*** Add File: new.txt",
    "*** Update File: a.txt",
    "*** Delete File: d/b.txt",
    "*** Move to: moved.txt",
    "*** End of File",
    "@@",
    "@@ def f():",
    " alpha",
    "-beta",
    "+BETA",
    "",
]
random_patch = st.one_of(
    st.text(max_size=200),
    st.lists(st.one_of(st.sampled_from(V4A_LINES), line_text), max_size=12).map("\n".join),
)


def check_patch(text: str) -> None:
    """apply_patch applies, or raises PatchError and changes nothing; never touches the outside."""
    with scratch() as base:
        root = make_patch_tree(base)
        text = text.replace("OUTSIDE_ABS", str(base / "outside_file.txt"))
        before, outside = snapshot(root), outside_of(base)
        try:
            result = apply_patch(text, root)
        except PatchError as exc:
            assert str(exc).strip()
            assert snapshot(root) == before, f"PatchError ({exc}) but files changed"
        else:
            moved = [p for pair in result.moved for p in pair]
            for rel in [*result.added, *result.updated, *result.deleted, *moved]:
                assert not Path(rel).is_absolute() and ".." not in Path(rel).parts, rel
        assert outside_of(base) == outside, "a file outside the workspace changed"


@settings(CI, max_examples=100)
@given(text=random_patch)
def test_random_text_applies_or_raises_patch_error(text: str) -> None:
    check_patch(text)


@settings(CI, max_examples=120)
@given(text=near_valid_patch())
@example(text="*** Begin Patch\n*** Update File: a.txt\n@@\n-beta\n+BETA\n*** End Patch")
@example(text="*** Begin Patch\n*** Update File: outfile\n@@\n-outside file\n+mine\n*** End Patch")
@example(text="*** Begin Patch\n*** Add File: out/new.txt\n+x\n*** End Patch")
@example(text="*** Begin Patch\n*** Delete File: ../outside/secret.txt\n*** End Patch")
def test_near_valid_patches_apply_or_change_nothing(text: str) -> None:
    check_patch(text)


@pytest.mark.parametrize(
    ("text", "setup"),
    [
        pytest.param(
            "*** Begin Patch\n*** Add File: new.txt\n+hi\n*** Add File: a.txt/x\n+y\n*** End Patch",
            None,
            id="partial-commit",
        ),
        pytest.param(
            "*** Begin Patch\n*** Add File: a\x00b\n+x\n*** End Patch",
            None,
            id="nul-in-path",
        ),
        pytest.param(
            "*** Begin Patch\n*** Add File: loop/x\n+x\n*** End Patch",
            lambda root: os.symlink("loop", root / "loop"),
            id="symlink-loop",
        ),
        pytest.param(
            "*** Begin Patch\n*** Add File: " + "x" * 300 + "\n+x\n*** End Patch",
            None,
            id="name-too-long",
        ),
        pytest.param(
            "*** Begin Patch\n*** Add File: s.txt\n+\ud800\n*** End Patch",
            None,
            id="lone-surrogate",
        ),
    ],
)
def test_patch_bugs(text: str, setup: Callable[[Path], None] | None) -> None:
    with scratch() as base:
        root = make_patch_tree(base)
        if setup is not None:
            setup(root)
        before = snapshot(root)
        with pytest.raises(PatchError):
            apply_patch(text, root)
        assert snapshot(root) == before


# -- model strings -------------------------------------------------------------------------------

model_strings = st.one_of(
    st.text(max_size=40),
    st.builds(
        lambda p, sep, rest: p + sep + rest,
        st.sampled_from([*KNOWN, "", "OpenAI", "openai ", "http", "oracle"]),
        st.sampled_from([":", "", "::", " : ", ":http://", ":https://h:8000/v1#"]),
        st.text(max_size=30),
    ),
)


@settings(CI, max_examples=200)
@given(text=model_strings)
@example(text="openai-compatible:http://h:8000/v1#m#n")
@example(text="  oracle  ")
def test_model_string_parses_or_raises_unknown_model(text: str) -> None:
    try:
        ref = parse_model(text)
    except UnknownModel as exc:
        assert str(exc).strip()
        return
    assert isinstance(ref, ModelRef) and ref.name
    assert parse_model(str(ref)) == ref


@settings(CI, max_examples=20)
@given(
    text=st.builds(
        lambda p, rest: f"{p}:{rest}",
        st.sampled_from(API_PROVIDERS),
        st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs")), max_size=30)
        | st.builds("http://{}:8000/v1#{}".format, identifier, identifier),
    )
)
def test_an_accepted_api_model_builds_a_provider(text: str) -> None:
    try:
        ref = parse_model(text)
    except UnknownModel:
        return
    with suppress(ProviderError):
        make_api_provider(ref, "sk-test")


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("openai-compatible:http://[#m", id="bracket"),
        pytest.param("openai-compatible:https://#m", id="no-host"),
        pytest.param("openai-compatible:http://h:99999/v1#m", id="port-out-of-range"),
        pytest.param("openai-compatible:http:// h/v1#m", id="space-in-host"),
        pytest.param("openai-compatible:http://h\x00/v1#m", id="nul"),
    ],
)
def test_unusable_endpoint_urls_are_unknown_models(text: str) -> None:
    try:
        ref = parse_model(text)
    except UnknownModel:
        return
    assert usable_url(ref.base_url or ""), ref.base_url


def usable_url(url: str) -> bool:
    """A URL an HTTP client can connect to: a host, a valid port, no spaces or control characters."""
    if any(c.isspace() or ord(c) < 32 for c in url):
        return False
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError when out of range
    except ValueError:
        return False
    return bool(parts.hostname)


# -- tool arguments ------------------------------------------------------------------------------

SECRET = "LABKUBE-OUTSIDE-SECRET-7f3a"


def make_tool_base(base: Path) -> tuple[Path, ToolContext, dict[str, Tool]]:
    ws = base / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "notes.txt").write_text("a file the agent can read\nsecond line\n")
    (ws / "sub" / "x.py").write_text("print('hi')\n")
    (base / "secret.txt").write_text(f"{SECRET}\n")
    (base / "outside").mkdir()
    (base / "outside" / "inner.txt").write_text(f"{SECRET} inner\n")
    os.symlink(base / "secret.txt", ws / "link_file")
    os.symlink(base / "outside", ws / "link_dir")
    os.symlink(base / "created_outside.txt", ws / "dangling")
    ctx = ToolContext(workspace=Workspace(ws), jobs=JobManager(base / "jobs"), default_timeout_s=20)
    return ws, ctx, {t.name: t for t in research_tools(ctx)}


def call(tool: Tool, args: dict[str, Any]) -> str:
    """The tool's output or its ToolError text; any other exception fails the test."""
    try:
        out = asyncio.run(tool(args))
    except ToolError as exc:
        return f"ToolError: {exc}"
    assert isinstance(out, str)
    return out


@functools.cache
def tool_params() -> dict[str, dict[str, Any]]:
    with tempfile.TemporaryDirectory() as d:
        return {t.name: t.parameters for t in research_tools(ToolContext(workspace=Workspace(d)))}


# Paths in and out of the workspace. NUL bytes, over-long names and paths under a regular file
# are left out: test_tool_bugs pins what they do.
tool_paths = st.one_of(
    st.sampled_from(
        [
            "notes.txt",
            "sub",
            "sub/x.py",
            "new.txt",
            "sub/new/deep.txt",
            ".",
            "",
            " ",
            "..",
            "../secret.txt",
            "ABS_SECRET",
            "ABS_WS",
            "link_file",
            "link_dir",
            "link_dir/inner.txt",
            "dangling",
            "./notes.txt",
            "sub/../notes.txt",
            "sub/../../secret.txt",
            "~",
            "/dev/null",
        ]
    ),
    st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs"), blacklist_characters="/"), max_size=20),
)
PATTERNS = ["a", ".", "^second", "LABKUBE", "(", "[a-", "\\", "(?i)FILE", ""]


def argument_value(name: str, schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    plausible: st.SearchStrategy[Any]
    if name == "path":
        plausible = tool_paths
    elif name == "pattern":
        plausible = st.sampled_from(PATTERNS) | st.text(max_size=8)
    elif name == "patch":
        plausible = near_valid_patch() | random_patch
    elif name == "job_id":
        plausible = st.sampled_from(["job1", "job2", "", "../job1"])
    elif schema.get("type") == "integer":
        plausible = st.integers(-(10**6), 10**6)
    else:
        plausible = st.text(max_size=30)
    return mostly(plausible, plain_json, odds=6)  # no NUL: see test_tool_bugs


def tool_arguments(name: str) -> st.SearchStrategy[dict[str, Any]]:
    """Mostly well-shaped calls (required arguments present, plausible values), sometimes any shape."""
    params = tool_params()[name]
    props = params["properties"]
    required = {p: argument_value(p, props[p]) for p in params["required"]}
    optional = {p: argument_value(p, s) for p, s in props.items() if p not in required}
    shaped = st.fixed_dictionaries(required, optional=optional)
    fuzzed = st.builds(
        lambda a, b: {**a, **b},
        st.fixed_dictionaries({}, optional={p: argument_value(p, s) for p, s in props.items()}),
        st.dictionaries(st.text(max_size=8), json_values, max_size=2),
    )
    return mostly(shaped, fuzzed, odds=2)


def fill_paths(args: dict[str, Any], base: Path) -> dict[str, Any]:
    out = dict(args)
    for key, value in out.items():
        if isinstance(value, str):
            out[key] = value.replace("ABS_SECRET", str(base / "secret.txt")).replace("ABS_WS", str(base / "ws"))
    return out


@pytest.mark.parametrize(
    "name", ["read_file", "write_file", "search", "apply_patch", "check_async", "cancel_async", "end_task"]
)
@settings(CI, max_examples=30)
@given(data=st.data())
def test_tool_arguments_give_output_or_tool_error(name: str, data: st.DataObject) -> None:
    args = data.draw(tool_arguments(name))
    with scratch() as base:
        _ws, ctx, tools = make_tool_base(base)
        assert ctx.jobs is not None
        if name in ("check_async", "cancel_async"):
            ctx.jobs.start("true", ["bash", "-c", "true"], ctx.workspace.root, ctx.env())  # job1 exists
        try:
            call(tools[name], fill_paths(args, base))
        finally:
            ctx.jobs.kill_all()


def would_validate(name: str, args: dict[str, Any]) -> bool:
    """Whether Tool.__call__ would pass `args` on to execute (so a command would run)."""
    params = tool_params()[name]
    props = params["properties"]
    if set(args) - set(props) or any(p not in args for p in params["required"]):
        return False
    types = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "array": list, "object": dict}
    for key, value in args.items():
        expected = types.get(props[key].get("type"))
        if expected and (not isinstance(value, expected) or (isinstance(value, bool) and expected is not bool)):
            return False
    return True


HARMLESS = {"bash": ["true", "echo hi", "pwd", ":"], "python": ["pass", "print(1)"], "start_async": ["true"]}


@pytest.mark.parametrize("name", list(HARMLESS))
@settings(CI, max_examples=20)
@given(data=st.data())
def test_command_tools_validate_arguments_before_running(name: str, data: st.DataObject) -> None:
    """Argument shapes are fuzzed; whatever would pass validation runs a harmless command."""
    args = data.draw(tool_arguments(name))
    if would_validate(name, args):
        command_key = "code" if name == "python" else "command"
        args[command_key] = data.draw(st.sampled_from(HARMLESS[name]))
        if "timeout" in args:
            args["timeout"] = data.draw(st.integers(-3, 5))  # huge values: see test_tool_bugs
    with scratch() as base:
        _ws, ctx, tools = make_tool_base(base)
        try:
            call(tools[name], args)
        finally:
            assert ctx.jobs is not None
            ctx.jobs.kill_all()


escape_paths = st.one_of(
    tool_paths,
    st.builds(
        lambda prefix, parts: prefix + "/".join(parts),
        st.sampled_from(["", "", "/", "ABS_WS/", "./"]),
        st.lists(
            st.sampled_from(
                ["..", ".", "link_dir", "link_file", "dangling", "sub", "outside", "secret.txt", "inner.txt", "ws"]
            ),
            min_size=1,
            max_size=5,
        ),
    ),
)


@pytest.mark.parametrize(
    "name",
    [
        "read_file",
        "write_file",
        "apply_patch",
        pytest.param(
            "search",
        ),
    ],
)
@settings(CI, max_examples=60)
@given(path=escape_paths, line=st.sampled_from(["a", SECRET]))
@example(path=".", line="a")
@example(path="link_file", line=SECRET)
def test_file_tools_never_reach_outside_the_workspace(name: str, path: str, line: str) -> None:
    with scratch() as base:
        ws, _ctx, tools = make_tool_base(base)
        path = fill_paths({"p": path}, base)["p"]
        before = outside_of(base)
        args: dict[str, Any] = {
            "read_file": {"path": path},
            "write_file": {"path": path, "content": "overwritten\n"},
            "search": {"pattern": ".", "path": path},
            "apply_patch": {
                "patch": f"*** Begin Patch\n*** Update File: {path}\n@@\n-{line}\n+overwritten\n*** End Patch"
            },
        }[name]
        out = call(tools[name], args)
        if not (name == "apply_patch" and line == SECRET):  # a PatchError may quote the patch's own line
            assert SECRET not in out, out
        assert outside_of(base) == before, "a file outside the workspace changed"
        if name == "apply_patch":
            out = call(tools[name], {"patch": f"*** Begin Patch\n*** Delete File: {path}\n*** End Patch"})
            assert outside_of(base) == before
            assert ws.is_dir()


@pytest.mark.parametrize(
    ("name", "args", "setup"),
    [
        pytest.param(
            "read_file",
            {"path": "a\x00b"},
            None,
            id="read_file-nul",
        ),
        pytest.param(
            "write_file",
            {"path": "notes.txt/x", "content": "x"},
            None,
            id="write_file-under-a-file",
        ),
        pytest.param(
            "read_file",
            {"path": "x" * 300},
            None,
            id="read_file-name-too-long",
        ),
        pytest.param(
            "write_file",
            {"path": "s.txt", "content": "\ud800"},
            None,
            id="write_file-surrogate",
        ),
        pytest.param(
            "write_file",
            {"path": "loop", "content": "x"},
            lambda ws: os.symlink("loop", ws / "loop"),
            id="write_file-symlink-loop",
        ),
        pytest.param(
            "search",
            {"pattern": "a{99999999999}"},
            None,
            id="search-huge-repeat",
        ),
        pytest.param(
            "bash",
            {"command": "true", "timeout": 10**400},
            None,
            id="bash-huge-timeout",
        ),
        pytest.param(
            "bash",
            {"command": "echo a\x00b"},
            None,
            id="bash-nul",
        ),
        pytest.param(
            "python",
            {"code": "print(1)  # \ud800"},
            None,
            id="python-surrogate",
        ),
        pytest.param(
            "start_async",
            {"command": "echo a\x00b"},
            None,
            id="start_async-nul",
        ),
    ],
)
def test_tool_bugs(name: str, args: dict[str, Any], setup: Callable[[Path], None] | None) -> None:
    with scratch() as base:
        ws, ctx, tools = make_tool_base(base)
        if setup is not None:
            setup(ws)
        before = snapshot(ws)
        try:
            out = call(tools[name], args)
        finally:
            assert ctx.jobs is not None
            ctx.jobs.kill_all()
        if out.startswith("ToolError") and name in ("write_file", "apply_patch"):
            assert snapshot(ws) == before


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1) | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@CI
@given(data=JSON_VALUES)
def test_the_store_writes_json_that_reads_back_as_the_standard_librarys_does(tmp_path: Path, data: object) -> None:
    """`write_json_atomic` encodes with pydantic-core (the standard library is slow with an indent): whatever it
    writes reads back, with Python's json, as what `json.dumps` of the same data reads back as, NaN and infinities
    included (a score may be NaN: written as null it would fail to read as a float)."""
    path = tmp_path / "value.json"
    write_json_atomic(path, data)
    text = path.read_text(encoding="utf-8")
    assert text.count("\n") == json.dumps(data, indent=2).count("\n") + 1  # its layout, a final newline added
    again = json.loads(text)
    assert json.dumps(again, sort_keys=True) == json.dumps(json.loads(json.dumps(data)), sort_keys=True)
