"""The fault record (tests/fault_record.py) through a real pytest session in a subprocess: a passing fault is
"yes", a failing one **FAILED**, a skipped one "not run here" with the reason; a plain run writes only the build
artefact it is given, never the tracked docs/reliability.md."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from fault_record import DOC

FAULT_TESTS = """
import pytest

def test_passes(fault):
    fault("fault that is handled", "injected so", "handled so")

def test_fails(fault):
    fault("fault that is not handled", "injected so", "handled so")
    assert False

def test_skips(fault):
    fault("fault that needs a cluster", "injected so", "handled so")
    pytest.skip("no kube-apiserver binary | here")
"""


def test_each_outcome_is_recorded_in_the_build_artefact(tmp_path: Path) -> None:
    (tmp_path / "test_inner.py").write_text(FAULT_TESTS)
    record, doc_before = tmp_path / "record.md", DOC.read_bytes()
    tests_dir = Path(__file__).parent
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "fault_record", "-p", "no:cacheprovider"]
    argv += ["--fault-record", str(record), "--rootdir", str(tmp_path), str(tmp_path / "test_inner.py")]
    proc = subprocess.run(
        argv,
        cwd=tmp_path,
        env={"PYTHONPATH": str(tests_dir), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the one failing test
    rows = [line for line in record.read_text().splitlines() if line.startswith("| fault ") and "injected so" in line]
    assert rows == [
        "| fault that is handled | injected so | handled so | yes |",
        "| fault that is not handled | injected so | handled so | **FAILED** |",
        "| fault that needs a cluster | injected so | handled so | not run here: no kube-apiserver binary \\| here |",
    ]
    assert f"fault record (3 faults): {record}" in proc.stdout
    assert DOC.read_bytes() == doc_before
