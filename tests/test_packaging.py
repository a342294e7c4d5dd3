"""`pip install .` (a real wheel, not editable) ships and imports every sub-package and the bundled tasks."""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SUBPACKAGES = ["labkube.agent", "labkube.tasks", "labkube.integrity", "labkube.operator", "labkube.results"]
WORLD_FOLDER = REPO / "tasks" / "gaia2"


def world_script_modules() -> set[str]:
    """world_server.py and the modules it imports by plain name from its own folder, and theirs: the world runs in
    ARE's virtualenv by path, outside labkube, so a sibling missing from the wheel breaks only there."""
    found, todo = set(), ["world_server"]
    while todo:
        name = todo.pop()
        found.add(name)
        for node in ast.walk(ast.parse((WORLD_FOLDER / f"{name}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                sibling = node.module
                if (WORLD_FOLDER / f"{sibling}.py").is_file() and sibling not in found:
                    todo.append(sibling)
    return found


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(REPO)],
        capture_output=True,
        text=True,
        check=False,
        cwd=out,
    )
    assert proc.returncode == 0, proc.stderr
    (whl,) = out.glob("labkube-*.whl")
    return whl


def test_wheel_maps_top_level_folders_to_subpackages(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for folder in ("agent", "tasks", "integrity", "operator", "results"):
        assert f"labkube/{folder}/__init__.py" in names
    assert not any(n.startswith(("operator/", "agent/")) for n in names), "a top-level package would shadow"
    assert "labkube/agent/prices.yaml" in names
    assert "labkube/data/demo.yaml" in names
    assert "labkube/results/templates/report.html.j2" in names
    world = world_script_modules()
    assert {"world_session", "world_health", "verdict_message"} <= world, world
    for module in sorted(world):
        assert f"labkube/tasks/gaia2/{module}.py" in names, module
    task = "labkube/tasks/bundled/researchgym/continual-learning-lite/"
    for f in (
        "task_description.md",
        "grading/grade.sh",
        "labkube.yaml",
        "oracle/plan.yaml",
        "data/task_0.npz",
    ):
        assert task + f in names, f


def test_installed_wheel_imports_every_subpackage(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    code = (
        "import importlib, labkube; "
        f"mods = [importlib.import_module(m) for m in {SUBPACKAGES!r}]; "
        "from labkube.tasks import bundled_tasks; "
        "from labkube.results.html_report import template_env; template_env().get_template('report.html.j2'); "
        "print(labkube.__file__); print(bundled_tasks())"
    )
    proc = subprocess.run(
        [sys.executable, "-P", "-c", code],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
        env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0].startswith(str(target))
    assert "researchgym/continual-learning-lite" in proc.stdout


def test_editable_install_imports_every_subpackage() -> None:
    import importlib

    for name in SUBPACKAGES:
        module = importlib.import_module(name)
        folder = name.split(".")[-1]
        assert Path(module.__file__).parent == REPO / folder


def test_a_process_importing_labkube_from_the_checkout_finds_every_subpackage() -> None:
    # Ray's workers run with the driver's working directory on sys.path: from a checkout's root that
    # directory's `labkube/` shadows an installed labkube, and must still lead to the sibling folders.
    code = (
        "import importlib.util, sys; sys.path.insert(0, sys.argv[1]); "
        f"print([importlib.util.find_spec(m).origin for m in {SUBPACKAGES!r}])"
    )
    proc = subprocess.run([sys.executable, "-S", "-c", code, str(REPO)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    for folder in ("agent", "tasks", "integrity", "operator", "results"):
        assert str(REPO / folder / "__init__.py") in proc.stdout
