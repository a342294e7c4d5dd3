"""The world imports ARE's document converter on first use (tasks/gaia2/deferred_imports.py), and what it then uses is
ARE's own: run in ARE's virtualenv against ARE's module. The world's modules import without the converter's
packages; ARE's file system app then converts documents (HTML, CSV, slides, plain text) to exactly what ARE's own
`MarkdownConverter` gives, with an instance of ARE's class, and `sys.modules` holds ARE's module from then on."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from labkube.tasks.gaia2 import setup_world_env, world_python

pytestmark = pytest.mark.gaia2

GAIA2 = Path(__file__).resolve().parents[1] / "tasks" / "gaia2"

SCRIPT = """
import io, sys, tempfile, os
sys.path.insert(0, sys.argv[1])
import deferred_imports
import world_session, world_judge, world_health, world_scenario

heavy = ("pandas", "pptx", "markdownify", "mammoth", "pdfminer")
assert not [m for m in heavy if m in sys.modules], [m for m in heavy if m in sys.modules]
from are.simulation.apps import sandbox_file_system
stand_in = sys.modules["are.simulation.core.mdconvert"]
assert isinstance(stand_in, deferred_imports._DeferredModule)

import pptx  # python-pptx, which ARE's converter reads slides with
folder = tempfile.mkdtemp()
deck = pptx.Presentation()
slide = deck.slides.add_slide(deck.slide_layouts[1])
slide.shapes.title.text = "Minutes"
slide.placeholders[1].text = "Lunch moved to noon."
deck.save(os.path.join(folder, "minutes.pptx"))
documents = {
    "page.html": "<html><body><h1>Trip</h1><p>Gate <b>B12</b>, <a href='https://x.example'>map</a></p></body></html>",
    "table.csv": "name,day\\nAda,Mon\\nAlan,Tue\\n",
    "notes.txt": "plain notes",
}
for name, text in documents.items():
    with open(os.path.join(folder, name), "w") as fh:
        fh.write(text)

app = sandbox_file_system.SandboxLocalFileSystem(sandbox_dir=folder)
converter = app._md_converter
import are.simulation.core.mdconvert as ares
assert sys.modules["are.simulation.core.mdconvert"] is ares and not isinstance(ares, deferred_imports._DeferredModule)
assert type(converter) is ares.MarkdownConverter, type(converter)
assert stand_in.DocumentConverterResult is ares.DocumentConverterResult  # any other name: ARE's own

own = ares.MarkdownConverter()
for name in [*documents, "minutes.pptx"]:
    path = os.path.join(folder, name)
    ext = os.path.splitext(name)[1]
    with open(path, "rb") as fh:
        ours = converter.convert_io(io.BytesIO(fh.read()), file_extension=ext)
    with open(path, "rb") as fh:
        theirs = own.convert_io(io.BytesIO(fh.read()), file_extension=ext)
    assert ours.text_content == theirs.text_content and ours.title == theirs.title, (name, ours.text_content)
    assert ours.text_content.strip(), name
print("OK")
"""


def test_the_world_converts_documents_with_ares_own_converter_imported_on_first_use() -> None:
    setup_world_env()
    ran = subprocess.run(
        [str(world_python()), "-c", SCRIPT, str(GAIA2)], capture_output=True, text=True, timeout=120, check=False
    )
    assert ran.returncode == 0 and ran.stdout.startswith("OK"), ran.stdout + ran.stderr
