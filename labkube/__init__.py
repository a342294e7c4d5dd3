"""labkube: a testbed for long-horizon AI agents. This folder is the spine every room stands on.

It holds only what every part shares: the schemas (task card, run spec, campaign, result, budgets, model
references, the integrity verdict), the results store and its report rows, and the metrics registry. The command
line lives here too but is a room of its own, above all others: `cli.py` assembles one module per command family
(`*_cli.py`), and `cli_checks.py` holds its checks of what a user typed. The rooms are sub-packages in sibling
folders: tasks/, agent/, integrity/, operator/ (the write side) and results/ (the read side); docs/architecture.md
says what each may import.
"""

import os as _os

# In a source checkout the sub-packages live in sibling folders (agent/, tasks/, integrity/, operator/, results/);
# an installed labkube has them inside this package. A process that imports labkube from the checkout
# (its working directory on sys.path, as Ray's workers have) must still find `labkube.operator` & co.
_checkout = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_checkout, "pyproject.toml")) and _os.path.isfile(
    _os.path.join(_checkout, "operator", "__init__.py")
):
    __path__.append(_checkout)  # type: ignore[name-defined]
del _os, _checkout
