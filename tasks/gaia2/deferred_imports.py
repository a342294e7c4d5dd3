"""ARE's document converter, imported when a world first converts a document rather than when the world starts.

Importing this module (world_server.py does, before any of ARE) puts a stand-in for `are.simulation.core.mdconvert`
in `sys.modules`. ARE imports that module with its file system app (`from are.simulation.core.mdconvert import
MarkdownConverter`), and with it pandas, python-pptx, BeautifulSoup, markdownify, mammoth and pdfminer: about 0.6
s of the world's 1.1 s of imports, which every campaign pays at its start and which only a run that reads a
document (the file system app's `read_document`) uses.

The stand-in's `MarkdownConverter()` imports ARE's module and returns ARE's own `MarkdownConverter`; any other name
of the module, asked of the stand-in, is ARE's own too. From the first use on, `sys.modules` holds ARE's module. So a
converter is always ARE's, built by ARE's constructor (tests/test_world_deferred_imports.py checks this in ARE's
virtualenv against ARE's module).
"""

from __future__ import annotations

import importlib
import sys
import threading
import types
from typing import Any

DEFERRED = "are.simulation.core.mdconvert"
_loading = threading.Lock()  # the world serves requests on threads


class _DeferredModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # what the import system asks of any module: not a reason to import it
            raise AttributeError(name)
        return getattr(ares_module(), name)


def ares_module() -> types.ModuleType:
    """ARE's `mdconvert`, imported on first use."""
    with _loading:
        module = sys.modules.get(DEFERRED)
        if module is not None and not isinstance(module, _DeferredModule):
            return module
        sys.modules.pop(DEFERRED, None)
        try:
            return importlib.import_module(DEFERRED)
        except BaseException:
            if module is not None:
                sys.modules[DEFERRED] = module
            raise


class MarkdownConverter:
    """Stands in for ARE's class in the modules that imported it by name: constructing one builds ARE's."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        return ares_module().MarkdownConverter(*args, **kwargs)


def defer() -> None:
    if DEFERRED in sys.modules:
        return
    stand_in = _DeferredModule(DEFERRED, "ARE's document converter, imported on first use (deferred_imports.py)")
    stand_in.MarkdownConverter = MarkdownConverter  # type: ignore[attr-defined]
    sys.modules[DEFERRED] = stand_in


defer()
