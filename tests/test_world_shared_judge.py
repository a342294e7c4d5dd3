"""What the world process no longer does per run changes no verdict (tasks/gaia2/world_judge.py, world_scenario.py).

Run in ARE's own virtualenv against ARE's own code, on the bundled scenarios:

- every hard-checks-only judge is a copy of one built once (`SharedHardChecksJudgeFactory`): the verdicts of a
  passing and a failing trace of each scenario, judged one after another by copies, equal those of judges ARE's own
  `JudgeFactory` builds, rationale and matches included; no copy sees what an earlier one judged;
- ARE's environment formats a log message only when its logger would emit it, and then the same message;
- ARE's `type_check` and `event_registered` get each function's signature and type hints as `inspect` and `typing`
  compute them, and `type_check` still refuses an argument of the wrong type.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.gaia2

GAIA2 = Path(__file__).resolve().parents[1] / "tasks" / "gaia2"
BUNDLED = Path(__file__).resolve().parents[1] / "tasks" / "bundled" / "gaia2"

JUDGE_SCRIPT = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import deferred_imports
from are.simulation.environment import Environment
from are.simulation.scenarios.scenario_imported_from_json import utils as are_scenario_utils
from are.simulation.types import EventLog, EventType
from are.simulation.validation import JudgeFactory
import world_judge
from world_judge import HARD_CHECKS_CONFIG, SharedHardChecksJudgeFactory, judge_matches
from world_scenario import import_json

world_judge.install_judge_caches()
assert are_scenario_utils.JudgeFactory is SharedHardChecksJudgeFactory

def traces(text):
    scenario = import_json(text)
    are_scenario_utils.preprocess_scenario(scenario, judge_config=HARD_CHECKS_CONFIG, offline_validation=True)
    passing = list(scenario.oracle_run_event_log)
    last_agent = max(i for i, e in enumerate(passing) if e.event_type == EventType.AGENT)
    return {"passing": passing, "an agent event short": passing[:last_agent] + passing[last_agent + 1 :]}

def verdict(text, trace):
    scenario = import_json(text)
    are_scenario_utils.preprocess_scenario(scenario, judge_config=HARD_CHECKS_CONFIG, offline_validation=True)
    env = Environment()
    env.event_log = EventLog.from_list_view(trace)
    result = scenario.validate(env)
    return scenario.judge, (result.success, result.rationale, repr(result.exception), judge_matches(scenario.judge))

cases = [(path.name, kind, path.read_text(), trace)
         for path in sorted(Path(sys.argv[2]).glob("*.json")) for kind, trace in traces(path.read_text()).items()]
shared = [verdict(text, trace) for _, _, text, trace in cases]
are_scenario_utils.JudgeFactory = JudgeFactory
own = [verdict(text, trace) for _, _, text, trace in cases]

outcomes = set()
for (name, kind, _, _), (shared_judge, got), (own_judge, expected) in zip(cases, shared, own):
    assert got == expected, (name, kind, got, expected)
    assert type(shared_judge) is type(own_judge)
    outcomes.add((kind, got[0]))
assert outcomes == {("passing", True), ("an agent event short", False)}, outcomes
judges = [judge for judge, _ in shared]
assert len({id(j.state) for j in judges}) == len(judges) and len({id(j.error_logs) for j in judges}) == len(judges)
pristine = SharedHardChecksJudgeFactory._pristine
assert pristine is not None and not pristine.state.initialized and pristine.error_logs == []
assert all(j.event_judges is pristine.event_judges for j in judges)  # built once
print("OK", len(cases))
"""

LOG_SCRIPT = """
import logging, sys
sys.path.insert(0, sys.argv[1])
import deferred_imports
from are.simulation import environment as are_environment
from are.simulation.environment import Environment
import world_scenario

records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())
are_environment.logger.addHandler(Keep())
formatted = []
colored = are_environment.colored
are_environment.colored = lambda *a, **k: formatted.append(a[0]) or colored(*a, **k)

def logged(level, calls):
    records.clear(); formatted.clear()
    are_environment.logger.setLevel(level)
    env = Environment()
    calls(env)
    return list(records), len(formatted)

def calls(env):
    env.log_debug("a debug message"); env.log_info("an info message"); env.log_warning("a warning")
    env.log_error("an error"); env._log("an unknown level", "trace", "blue")

before = {level: logged(level, calls) for level in (logging.DEBUG, logging.WARNING)}
world_scenario.format_only_logged_environment_messages()
world_scenario.format_only_logged_environment_messages()  # twice: wrapped once
after = {level: logged(level, calls) for level in (logging.DEBUG, logging.WARNING)}
# The same records; formatted only what is emitted (ARE formats a message at a level it does not name, and drops it).
debug_records, warning_records = before[logging.DEBUG][0], before[logging.WARNING][0]
assert after == {logging.DEBUG: (debug_records, len(debug_records)), logging.WARNING: (warning_records, 2)}, after
assert [r.split("] ", 1)[1] for r in warning_records] == ["a warning", "an error"], warning_records
assert before[logging.WARNING][1] == before[logging.DEBUG][1] > 2  # ARE formats every message, logged or not
print("OK")
"""

SIGNATURES_SCRIPT = """
import inspect, sys, typing
sys.path.insert(0, sys.argv[1])
import deferred_imports
from are.simulation import types as are_types
from are.simulation.apps.contacts import ContactsApp
from are.simulation.utils import type_utils
import world_scenario

world_scenario.install_environment_shortcuts()
world_scenario.install_environment_shortcuts()  # twice: installed once
remembered = type_utils.inspect
assert isinstance(remembered, world_scenario._RememberedSignatures) and are_types.inspect is remembered
assert remembered.isfunction is inspect.isfunction and remembered.Parameter is inspect.Parameter

functions = [f for f in vars(ContactsApp).values() if inspect.isfunction(f)]
for fn in functions + [ContactsApp.get_contact]:
    for _ in range(2):  # computed, then remembered
        assert remembered.signature(fn) == inspect.signature(fn), fn
        hints = type_utils.get_type_hints(fn)
        assert hints == typing.get_type_hints(fn), fn
        hints.clear()  # what a caller does with its copy is not remembered
bound = ContactsApp().get_contact
assert remembered.signature(bound) == inspect.signature(bound)
extras = {"include_extras": True}
assert type_utils.get_type_hints(ContactsApp, **extras) == typing.get_type_hints(ContactsApp, **extras)

small = world_scenario._RememberedSignatures(limit=1)
small.signature(functions[0]); small.signature(functions[1])
assert list(small._seen) == [functions[0]] and small.signature(functions[1]) == inspect.signature(functions[1])

@type_utils.type_check
def typed(name: str, count: int | None = None) -> str:
    return name * (count or 1)

assert typed("ab", 2) == "abab" and typed("ab") == "ab"
for bad in ((3,), ("ab", "2")):
    try:
        typed(*bad)
    except TypeError as exc:
        assert "must be of type" in str(exc), exc
    else:
        raise AssertionError(f"type_check let {bad} through")
print("OK")
"""


def run_in_are(are_python: Path, script: str, *args: str) -> str:
    ran = subprocess.run(
        [str(are_python), "-c", script, str(GAIA2), *args], capture_output=True, text=True, timeout=300, check=False
    )
    assert ran.returncode == 0 and ran.stdout.startswith("OK"), ran.stdout + ran.stderr[-4000:]
    return ran.stdout


def test_copies_of_one_hard_checks_judge_give_the_verdicts_of_judges_ares_factory_builds(are_python: Path) -> None:
    assert run_in_are(are_python, JUDGE_SCRIPT, str(BUNDLED)).split() == ["OK", "10"]


def test_the_environment_formats_only_what_its_logger_emits_and_emits_the_same(are_python: Path) -> None:
    run_in_are(are_python, LOG_SCRIPT)


def test_tool_calls_get_signatures_and_type_hints_as_inspect_and_typing_compute_them(are_python: Path) -> None:
    run_in_are(are_python, SIGNATURES_SCRIPT)
