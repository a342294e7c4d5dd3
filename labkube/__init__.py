"""labkube: a testbed for long-horizon AI agents."""

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
