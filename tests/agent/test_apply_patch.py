from pathlib import Path

import pytest

from labkube.agent.rg.apply_patch import (
    AddFile,
    DeleteFile,
    Hunk,
    HunkLine,
    PatchError,
    UpdateFile,
    apply_patch,
    parse_patch,
)


def patch(*lines: str) -> str:
    return "\n".join(["*** Begin Patch", *lines, "*** End Patch"]) + "\n"


def snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def write(root: Path, rel: str, text: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode("utf-8"))
    return path


def read(root: Path, rel: str) -> str:
    return (root / rel).read_bytes().decode("utf-8")


def fails(root: Path, text: str) -> str:
    """Apply `text`, expect a PatchError that changed nothing, and return its message."""
    before = snapshot(root)
    with pytest.raises(PatchError) as caught:
        apply_patch(text, root)
    assert snapshot(root) == before
    return str(caught.value)


TRAIN = """\
class Model:
    def train(self):
        lr = 0.1
        return lr

    def eval(self):
        lr = 0.1
        return lr
"""


# --- adding, deleting, updating --------------------------------------------------------------


def test_add_file_writes_content_with_final_newline(tmp_path: Path) -> None:
    result = apply_patch(patch("*** Add File: hello.py", "+print('hi')", "+x = 1"), tmp_path)
    assert read(tmp_path, "hello.py") == "print('hi')\nx = 1\n"
    assert result.added == ["hello.py"]


def test_add_file_creates_parent_directories(tmp_path: Path) -> None:
    apply_patch(patch("*** Add File: src/pkg/mod.py", "+pass"), tmp_path)
    assert read(tmp_path, "src/pkg/mod.py") == "pass\n"


def test_add_file_with_no_lines_creates_empty_file(tmp_path: Path) -> None:
    apply_patch(patch("*** Add File: empty.txt"), tmp_path)
    assert read(tmp_path, "empty.txt") == ""


def test_add_file_keeps_empty_plus_lines(tmp_path: Path) -> None:
    apply_patch(patch("*** Add File: a.txt", "+one", "+", "+three"), tmp_path)
    assert read(tmp_path, "a.txt") == "one\n\nthree\n"


def test_delete_file_removes_it(tmp_path: Path) -> None:
    write(tmp_path, "old.txt", "bye\n")
    result = apply_patch(patch("*** Delete File: old.txt"), tmp_path)
    assert not (tmp_path / "old.txt").exists()
    assert result.deleted == ["old.txt"]


def test_update_single_hunk_replaces_line(tmp_path: Path) -> None:
    write(tmp_path, "cfg.py", "a = 1\nb = 2\nc = 3\n")
    result = apply_patch(patch("*** Update File: cfg.py", "@@", " a = 1", "-b = 2", "+b = 20", " c = 3"), tmp_path)
    assert read(tmp_path, "cfg.py") == "a = 1\nb = 20\nc = 3\n"
    assert result.updated == ["cfg.py"]


def test_update_without_at_line_applies_first_hunk(tmp_path: Path) -> None:
    write(tmp_path, "cfg.py", "a = 1\nb = 2\n")
    apply_patch(patch("*** Update File: cfg.py", " a = 1", "-b = 2", "+b = 3"), tmp_path)
    assert read(tmp_path, "cfg.py") == "a = 1\nb = 3\n"


def test_update_multiple_hunks_apply_in_file_order(tmp_path: Path) -> None:
    write(tmp_path, "m.py", "".join(f"line{i}\n" for i in range(10)))
    apply_patch(
        patch(
            "*** Update File: m.py",
            "@@",
            " line1",
            "-line2",
            "+LINE2",
            "@@",
            " line7",
            "-line8",
            "+LINE8",
            "+extra",
        ),
        tmp_path,
    )
    expected = [f"line{i}" for i in range(10)]
    expected[2], expected[8] = "LINE2", "LINE8\nextra"
    assert read(tmp_path, "m.py") == "\n".join(expected) + "\n"


def test_second_hunk_with_same_context_matches_after_first(tmp_path: Path) -> None:
    write(tmp_path, "m.py", "x = 0\ny = 1\nx = 0\ny = 1\n")
    hunk = ["@@", " x = 0", "-y = 1", "+y = 2"]
    apply_patch(patch("*** Update File: m.py", *hunk, *hunk), tmp_path)
    assert read(tmp_path, "m.py") == "x = 0\ny = 2\nx = 0\ny = 2\n"


def test_several_files_in_one_patch(tmp_path: Path) -> None:
    write(tmp_path, "keep.py", "v = 1\n")
    write(tmp_path, "gone.py", "dead\n")
    result = apply_patch(
        patch(
            "*** Add File: new.py",
            "+fresh",
            "*** Update File: keep.py",
            "-v = 1",
            "+v = 2",
            "*** Delete File: gone.py",
        ),
        tmp_path,
    )
    assert snapshot(tmp_path) == {"keep.py": b"v = 2\n", "new.py": b"fresh\n"}
    assert (result.added, result.updated, result.deleted) == (["new.py"], ["keep.py"], ["gone.py"])


def test_two_updates_of_one_file_in_one_patch_both_apply(tmp_path: Path) -> None:
    write(tmp_path, "a.py", "a\nb\n")
    apply_patch(patch("*** Update File: a.py", "-a", "+A", "*** Update File: a.py", "-b", "+B"), tmp_path)
    assert read(tmp_path, "a.py") == "A\nB\n"


def test_add_then_update_in_same_patch(tmp_path: Path) -> None:
    apply_patch(patch("*** Add File: n.py", "+one", "*** Update File: n.py", "-one", "+two"), tmp_path)
    assert read(tmp_path, "n.py") == "two\n"


# --- moves ---------------------------------------------------------------------------------


def test_move_without_hunks_is_pure_rename(tmp_path: Path) -> None:
    write(tmp_path, "a.py", "same\n")
    result = apply_patch(patch("*** Update File: a.py", "*** Move to: lib/b.py"), tmp_path)
    assert snapshot(tmp_path) == {"lib/b.py": b"same\n"}
    assert result.moved == [("a.py", "lib/b.py")]
    assert result.updated == []


def test_move_with_edits_writes_edited_content_at_destination(tmp_path: Path) -> None:
    write(tmp_path, "a.py", "x = 1\n")
    apply_patch(patch("*** Update File: a.py", "*** Move to: b.py", "@@", "-x = 1", "+x = 2"), tmp_path)
    assert snapshot(tmp_path) == {"b.py": b"x = 2\n"}


def test_move_onto_existing_file_fails(tmp_path: Path) -> None:
    write(tmp_path, "a.py", "a\n")
    write(tmp_path, "b.py", "b\n")
    message = fails(tmp_path, patch("*** Update File: a.py", "*** Move to: b.py"))
    assert "Update File a.py" in message and "already exists" in message


def test_move_to_after_a_hunk_fails(tmp_path: Path) -> None:
    write(tmp_path, "a.py", "a\n")
    message = fails(tmp_path, patch("*** Update File: a.py", "-a", "+b", "*** Move to: b.py"))
    assert "Move to" in message


# --- locating hunks ------------------------------------------------------------------------


def test_at_header_disambiguates_repeated_code(tmp_path: Path) -> None:
    write(tmp_path, "m.py", TRAIN)
    apply_patch(
        patch("*** Update File: m.py", "@@ def eval(self):", "-        lr = 0.1", "+        lr = 0.0"),
        tmp_path,
    )
    head, tail = TRAIN.split("    def eval(self):")
    assert read(tmp_path, "m.py") == head + "    def eval(self):" + tail.replace("lr = 0.1", "lr = 0.0")


def test_nested_at_headers_narrow_to_method_of_second_class(tmp_path: Path) -> None:
    source = "class A:\n    def run(self):\n        return 1\n\nclass B:\n    def run(self):\n        return 1\n"
    write(tmp_path, "m.py", source)
    apply_patch(
        patch(
            "*** Update File: m.py",
            "@@ class B:",
            "@@     def run(self):",
            "-        return 1",
            "+        return 2",
        ),
        tmp_path,
    )
    assert read(tmp_path, "m.py") == source[: source.rindex("1")] + "2\n"


def test_at_header_line_may_also_be_first_context_line(tmp_path: Path) -> None:
    write(tmp_path, "m.py", TRAIN)
    apply_patch(
        patch(
            "*** Update File: m.py",
            "@@ def eval(self):",
            "     def eval(self):",
            "-        lr = 0.1",
            "+        lr = 1",
        ),
        tmp_path,
    )
    assert "    def eval(self):\n        lr = 1\n" in read(tmp_path, "m.py")


def test_at_header_not_found_fails(tmp_path: Path) -> None:
    write(tmp_path, "m.py", TRAIN)
    message = fails(
        tmp_path, patch("*** Update File: m.py", "@@ def fit(self):", "-        lr = 0.1", "+        lr = 1")
    )
    assert message.startswith("Update File m.py, hunk 1: '@@' line not found")
    assert "def fit(self):" in message


def test_unified_diff_range_header_is_ignored(tmp_path: Path) -> None:
    write(tmp_path, "m.py", "a\nb\n")
    apply_patch(patch("*** Update File: m.py", "@@ -1,2 +1,2 @@", " a", "-b", "+c"), tmp_path)
    assert read(tmp_path, "m.py") == "a\nc\n"


def test_end_of_file_hunk_matches_at_the_end(tmp_path: Path) -> None:
    write(tmp_path, "m.py", "return x\nmiddle\nreturn x\n")
    apply_patch(patch("*** Update File: m.py", "-return x", "+return y", "*** End of File"), tmp_path)
    assert read(tmp_path, "m.py") == "return x\nmiddle\nreturn y\n"


def test_end_of_file_hunk_fails_when_context_is_not_at_the_end(tmp_path: Path) -> None:
    write(tmp_path, "m.py", "a\nb\nc\n")
    message = fails(tmp_path, patch("*** Update File: m.py", " a", "+a2", "*** End of File"))
    assert "hunk 1" in message and "end of the file" in message


def test_end_of_file_hunk_with_only_added_lines_appends(tmp_path: Path) -> None:
    write(tmp_path, "m.py", "a\n")
    apply_patch(patch("*** Update File: m.py", "+b", "+c", "*** End of File"), tmp_path)
    assert read(tmp_path, "m.py") == "a\nb\nc\n"


def test_insertion_hunk_with_only_context_and_added_lines(tmp_path: Path) -> None:
    write(tmp_path, "m.py", "import os\nimport sys\n\nmain()\n")
    apply_patch(patch("*** Update File: m.py", " import os", "+import re", " import sys"), tmp_path)
    assert read(tmp_path, "m.py") == "import os\nimport re\nimport sys\n\nmain()\n"


def test_insertion_with_only_at_header_goes_right_after_it(tmp_path: Path) -> None:
    write(tmp_path, "m.py", TRAIN)
    apply_patch(patch("*** Update File: m.py", "@@ def eval(self):", '+        """Evaluate."""'), tmp_path)
    assert '    def eval(self):\n        """Evaluate."""\n        lr = 0.1\n' in read(tmp_path, "m.py")


def test_added_lines_without_any_anchor_are_rejected(tmp_path: Path) -> None:
    write(tmp_path, "m.py", "a\n")
    message = fails(tmp_path, patch("*** Update File: m.py", "+b"))
    assert "hunk 1" in message and "where to insert" in message


# --- matching levels -----------------------------------------------------------------------


def test_match_ignores_trailing_whitespace(tmp_path: Path) -> None:
    write(tmp_path, "m.py", "x = 1   \ny = 2\t\n")
    apply_patch(patch("*** Update File: m.py", " x = 1", "-y = 2", "+y = 3"), tmp_path)
    assert read(tmp_path, "m.py") == "x = 1   \ny = 3\n"


def test_match_ignores_indentation_and_keeps_file_context_lines(tmp_path: Path) -> None:
    write(tmp_path, "m.py", "def f():\n    a = 1\n    b = 2\n")
    apply_patch(patch("*** Update File: m.py", " a = 1", "-b = 2", "+    b = 3"), tmp_path)
    assert read(tmp_path, "m.py") == "def f():\n    a = 1\n    b = 3\n"


def test_exact_match_wins_over_earlier_loose_match(tmp_path: Path) -> None:
    write(tmp_path, "m.py", "    v = 1\nsep\nv = 1\n")
    apply_patch(patch("*** Update File: m.py", "-v = 1", "+v = 2"), tmp_path)
    assert read(tmp_path, "m.py") == "    v = 1\nsep\nv = 2\n"


def test_trailing_whitespace_level_wins_over_indentation_level(tmp_path: Path) -> None:
    write(tmp_path, "m.py", "  v = 1\nv = 1  \n")
    apply_patch(patch("*** Update File: m.py", "-v = 1", "+v = 2"), tmp_path)
    assert read(tmp_path, "m.py") == "  v = 1\nv = 2\n"


def test_empty_line_in_hunk_is_an_empty_context_line(tmp_path: Path) -> None:
    write(tmp_path, "m.py", "a = 1\n\nb = 2\n\nb = 2\n")
    apply_patch(patch("*** Update File: m.py", " a = 1", "", "-b = 2", "+b = 3"), tmp_path)
    assert read(tmp_path, "m.py") == "a = 1\n\nb = 3\n\nb = 2\n"


def test_blank_lines_between_operations_are_ignored(tmp_path: Path) -> None:
    write(tmp_path, "m.py", "a\n")
    apply_patch(patch("*** Update File: m.py", "-a", "+b", "", "*** Add File: n.py", "+n", "", ""), tmp_path)
    assert snapshot(tmp_path) == {"m.py": b"b\n", "n.py": b"n\n"}


# --- failures: nothing changes -------------------------------------------------------------


def test_context_not_found_names_file_hunk_and_line(tmp_path: Path) -> None:
    write(tmp_path, "cl.py", TRAIN)
    message = fails(
        tmp_path,
        patch(
            "*** Update File: cl.py",
            "@@",
            "-class Model:",
            "+class Net:",
            "@@",
            "     def train(self, steps):",
            "-        lr = 0.1",
            "+        lr = 0.2",
        ),
    )
    assert message == "Update File cl.py, hunk 2: context not found:\n        def train(self, steps):"


def test_context_not_found_points_at_first_mismatching_line(tmp_path: Path) -> None:
    write(tmp_path, "m.py", "a\nb\nc\n")
    message = fails(tmp_path, patch("*** Update File: m.py", " a", " b", "-z", "+y"))
    assert message.endswith("context not found:\n    z")


def test_failed_hunk_leaves_earlier_valid_operations_unwritten(tmp_path: Path) -> None:
    write(tmp_path, "ok.py", "x = 1\n")
    write(tmp_path, "bad.py", "y = 1\n")
    write(tmp_path, "doomed.py", "z\n")
    message = fails(
        tmp_path,
        patch(
            "*** Add File: new.py",
            "+new",
            "*** Update File: ok.py",
            "-x = 1",
            "+x = 2",
            "*** Delete File: doomed.py",
            "*** Update File: bad.py",
            "-nope",
            "+never",
        ),
    )
    assert message.startswith("Update File bad.py, hunk 1:")
    assert not (tmp_path / "new.py").exists()


def test_hunks_out_of_order_error_says_file_order(tmp_path: Path) -> None:
    write(tmp_path, "m.py", "a\nb\nc\n")
    message = fails(tmp_path, patch("*** Update File: m.py", "@@", "-c", "+C", "@@", "-a", "+A"))
    assert "hunk 2" in message and "file order" in message


def test_update_missing_file_fails(tmp_path: Path) -> None:
    message = fails(tmp_path, patch("*** Update File: nope.py", "-a", "+b"))
    assert message.startswith("Update File nope.py:") and "no such file" in message


def test_delete_missing_file_fails(tmp_path: Path) -> None:
    message = fails(tmp_path, patch("*** Delete File: nope.py"))
    assert message.startswith("Delete File nope.py:") and "no such file" in message


def test_update_after_delete_in_same_patch_fails(tmp_path: Path) -> None:
    write(tmp_path, "a.py", "a\n")
    message = fails(tmp_path, patch("*** Delete File: a.py", "*** Update File: a.py", "-a", "+b"))
    assert "Update File a.py" in message and "earlier in this patch" in message


def test_add_existing_file_fails(tmp_path: Path) -> None:
    write(tmp_path, "a.py", "a\n")
    message = fails(tmp_path, patch("*** Add File: a.py", "+b"))
    assert message.startswith("Add File a.py:") and "already exists" in message


def test_update_of_directory_fails(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    assert "directory" in fails(tmp_path, patch("*** Update File: pkg", "-a", "+b"))


# --- paths ---------------------------------------------------------------------------------


def test_dotdot_path_escaping_root_fails(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    message = fails(root, patch("*** Add File: ../evil.py", "+x"))
    assert "outside the workspace" in message
    assert not (tmp_path / "evil.py").exists()


def test_dotdot_path_staying_inside_root_is_allowed(tmp_path: Path) -> None:
    write(tmp_path, "a.py", "a\n")
    result = apply_patch(patch("*** Update File: sub/../a.py", "-a", "+b"), tmp_path)
    assert read(tmp_path, "a.py") == "b\n"
    assert result.updated == ["a.py"]


def test_absolute_path_fails(tmp_path: Path) -> None:
    target = tmp_path / "abs.py"
    message = fails(tmp_path, patch(f"*** Add File: {target}", "+x"))
    assert "absolute" in message
    assert not target.exists()


def test_symlink_resolving_outside_root_fails(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    outside = tmp_path / "outside"
    write(outside, "secret.txt", "s\n")
    root.mkdir()
    (root / "link").symlink_to(outside, target_is_directory=True)
    message = fails(root, patch("*** Update File: link/secret.txt", "-s", "+leaked"))
    assert "outside the workspace" in message
    assert read(outside, "secret.txt") == "s\n"


# --- malformed patches ---------------------------------------------------------------------


def test_missing_begin_patch_fails(tmp_path: Path) -> None:
    message = fails(tmp_path, "*** Add File: a.py\n+a\n*** End Patch\n")
    assert "*** Begin Patch" in message


def test_missing_end_patch_fails(tmp_path: Path) -> None:
    message = fails(tmp_path, "*** Begin Patch\n*** Add File: a.py\n+a\n")
    assert "*** End Patch" in message


def test_text_after_end_patch_fails(tmp_path: Path) -> None:
    assert "*** End Patch" in fails(tmp_path, patch("*** Add File: a.py", "+a") + "trailing words\n")


def test_patch_without_operations_fails(tmp_path: Path) -> None:
    assert "no file operations" in fails(tmp_path, patch())


def test_malformed_file_header_fails(tmp_path: Path) -> None:
    write(tmp_path, "a.py", "a\n")
    message = fails(tmp_path, patch("*** Update file: a.py", "-a", "+b"))
    assert message.startswith("line 2 of the patch: expected '*** Add File: '")


def test_file_header_without_path_fails(tmp_path: Path) -> None:
    assert "needs a path" in fails(tmp_path, patch("*** Add File:", "+a"))


def test_add_file_line_without_plus_fails(tmp_path: Path) -> None:
    message = fails(tmp_path, patch("*** Add File: a.py", "+one", "two"))
    assert message.startswith("Add File a.py: line 4 of the patch must start with '+'")


def test_update_line_without_prefix_fails(tmp_path: Path) -> None:
    write(tmp_path, "a.py", "a\nb\n")
    message = fails(tmp_path, patch("*** Update File: a.py", "@@", "a", "-b", "+c"))
    assert message.startswith("Update File a.py, hunk 1: line 4 of the patch must start with ' ', '-' or '+'")


def test_update_without_hunks_or_move_fails(tmp_path: Path) -> None:
    write(tmp_path, "a.py", "a\n")
    assert "no hunks" in fails(tmp_path, patch("*** Update File: a.py"))


# --- text conventions ----------------------------------------------------------------------


def test_crlf_patch_text_applies(tmp_path: Path) -> None:
    write(tmp_path, "a.py", "a\nb\n")
    apply_patch(patch("*** Update File: a.py", " a", "-b", "+c").replace("\n", "\r\n"), tmp_path)
    assert read(tmp_path, "a.py") == "a\nc\n"


def test_crlf_file_keeps_crlf_line_endings(tmp_path: Path) -> None:
    write(tmp_path, "w.txt", "a\r\nb\r\n")
    apply_patch(patch("*** Update File: w.txt", " a", "-b", "+c", "+d"), tmp_path)
    assert read(tmp_path, "w.txt") == "a\r\nc\r\nd\r\n"


def test_file_without_final_newline_stays_without(tmp_path: Path) -> None:
    write(tmp_path, "a.txt", "a\nb")
    apply_patch(patch("*** Update File: a.txt", " a", "-b", "+c"), tmp_path)
    assert read(tmp_path, "a.txt") == "a\nc"


def test_file_with_final_newline_keeps_it_when_last_line_changes(tmp_path: Path) -> None:
    write(tmp_path, "a.txt", "a\nb\n")
    apply_patch(patch("*** Update File: a.txt", "-b", "+c", "*** End of File"), tmp_path)
    assert read(tmp_path, "a.txt") == "a\nc\n"


def test_unicode_content_round_trips(tmp_path: Path) -> None:
    write(tmp_path, "u.md", "# Überblick\nπ ≈ 3.14 🚀\n")
    apply_patch(patch("*** Update File: u.md", " # Überblick", "-π ≈ 3.14 🚀", "+π ≈ 3.14159 ✓", "+日本語"), tmp_path)
    assert read(tmp_path, "u.md") == "# Überblick\nπ ≈ 3.14159 ✓\n日本語\n"


# --- public API ----------------------------------------------------------------------------


def test_parse_patch_returns_structured_operations() -> None:
    parsed = parse_patch(
        patch(
            "*** Add File: a.py",
            "+x",
            "*** Delete File: b.py",
            "*** Update File: c.py",
            "*** Move to: d.py",
            "@@ class C:",
            "@@ def f(self):",
            " keep",
            "-old",
            "+new",
            "*** End of File",
        )
    )
    assert parsed.ops == [
        AddFile("a.py", ["x"]),
        DeleteFile("b.py"),
        UpdateFile(
            "c.py",
            [
                Hunk(
                    ["class C:", "def f(self):"],
                    [HunkLine(" ", "keep"), HunkLine("-", "old"), HunkLine("+", "new")],
                    end_of_file=True,
                )
            ],
            move_to="d.py",
        ),
    ]


def test_summary_lists_every_change(tmp_path: Path) -> None:
    write(tmp_path, "u.py", "u\n")
    write(tmp_path, "d.py", "d\n")
    write(tmp_path, "m.py", "m\n")
    result = apply_patch(
        patch(
            "*** Add File: a.py",
            "+a",
            "*** Update File: u.py",
            "-u",
            "+U",
            "*** Delete File: d.py",
            "*** Update File: m.py",
            "*** Move to: n.py",
        ),
        tmp_path,
    )
    assert result.summary == "Patch applied: added a.py; updated u.py; deleted d.py; moved m.py -> n.py"
