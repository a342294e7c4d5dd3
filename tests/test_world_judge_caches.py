"""The world's judge caches (tasks/gaia2/world_judge.py) change what building ARE's judge costs, not what it holds.

Run in ARE's own virtualenv against ARE's own code: every prompt-templates constant ARE ships is turned into an
`LLMFunction` by ARE's original constructor and by the remembering one (twice: the second is a cache hit), and what
each holds (system prompt, user template, examples) must be the same.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from labkube.tasks.gaia2 import setup_world_env, world_python

pytestmark = pytest.mark.gaia2

GAIA2 = Path(__file__).resolve().parents[1] / "tasks" / "gaia2"

SCRIPT = """
import sys
sys.path.insert(0, sys.argv[1])
from are.simulation.validation import prompts
from are.simulation.validation.utils import llm_utils

original = llm_utils.LLMFunction.__init__
import world_judge
world_judge.install_judge_caches()
assert llm_utils.LLMFunction.__init__ is not original, "the cache is installed"

def held(init, templates):
    fn = llm_utils.LLMFunction.__new__(llm_utils.LLMFunction)
    init(fn, None, templates)
    return fn.system_prompt, fn.user_prompt_template, fn.examples

constants = [v for v in vars(prompts).values() if isinstance(v, prompts.LLMFunctionTemplates)]
assert len(constants) >= 5, constants
for templates in constants:
    expected = held(original, templates)
    assert held(llm_utils.LLMFunction.__init__, templates) == expected
    assert held(llm_utils.LLMFunction.__init__, templates) == expected  # from the cache
    assert world_judge._LLM_FUNCTIONS[id(templates)][0] is templates
print("OK", len(constants))
"""


def test_remembered_llm_functions_hold_what_ares_own_constructor_renders() -> None:
    setup_world_env()
    ran = subprocess.run(
        [str(world_python()), "-c", SCRIPT, str(GAIA2)], capture_output=True, text=True, timeout=120, check=False
    )
    assert ran.returncode == 0 and ran.stdout.startswith("OK"), ran.stdout + ran.stderr
