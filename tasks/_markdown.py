"""Markdown tables as ResearchGym task descriptions write them, and what the text around them says.

A results table has a header row (sometimes two: a row of column groups, then the columns), method rows,
and one or more `Your Method` rows. Above it may stand its own label: a bold line (`**State**`), a caption
(`Table 2: ... on ImageNet-A.`) or a heading. Metric directions come from ↑/↓ arrows, else from the metric's
usual convention (accuracy higher, loss lower).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
_SEPARATOR_CELL = re.compile(r"^:?-{2,}:?$")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*$")
_BOLD_LINE = re.compile(r"^\*\*([^*]+)\*\*:?$|^__([^_]+)__:?$")
_CAPTION = re.compile(r"^[*_]*\s*(?:table|tab\.)\s*(\d+[a-z]?)\s*[:.\-\u2013\u2014]\s*(.*?)[*_]*$", re.IGNORECASE)
_METRIC_COLUMN = re.compile(r"^metrics?$")
YOUR_METHOD = "your method"


@dataclass(frozen=True)
class MalformedRow:
    """A body row whose cell count differs from its header's."""

    line: int  # 1-based
    method: str  # its first cell, as `method_of` reads it
    cells: int
    read: bool  # its extra cells were all empty: read without them

    def problem(self, table: Table) -> str:
        what = "; read without its empty extra cells" if self.read else ""
        return (
            f"table {table.index} (line {table.line}): row at line {self.line} has {self.cells} cells, header has "
            f"{len(table.header)}{what}"
        )


@dataclass
class Table:
    index: int
    header: list[str]
    rows: list[list[str]] = field(default_factory=list)
    malformed: list[MalformedRow] = field(default_factory=list)
    line: int = 0  # 1-based line of the header
    label: str = ""  # the table's own label: a bold line, the subject of its caption, or a heading
    label_source: str = ""  # "bold", "caption", "heading", or "" when there is no label
    caption: str = ""  # the caption's text after `Table N:`
    number: str = ""  # the caption's table number (`3a`)

    def column(self, name: str) -> int | None:
        wanted = normalize_header(name)
        for i, cell in enumerate(self.header):
            if normalize_header(cell) == wanted:
                return i
        return None

    def row(self, method: str) -> list[str] | None:
        for row in self.rows:
            if row and method_of(row) == method.lower():
                return row
        return None

    def method_rows(self, method: str) -> list[int]:
        """Indices of the rows of `method` (a table may hold one `Your Method` row per section or metric)."""
        return [i for i, row in enumerate(self.rows) if row and method_of(row) == method.lower()]

    def metric_column(self) -> int | None:
        """The column naming each row's metric (`| Tokenization | Metric | NER | ...`), if there is one."""
        return next(
            (i for i, cell in enumerate(self.header) if i and _METRIC_COLUMN.match(normalize_header(cell))), None
        )


def method_of(row: list[str]) -> str:
    return row[0].strip().strip("*").strip().lower()


def compact(text: str) -> str:
    """Lower-case letters and digits only, to compare names written differently (`Re-ID`, `ReID`)."""
    return re.sub(r"[^a-z0-9]", "", text.lower())


def normalize_header(text: str) -> str:
    return re.sub(r"\s+", " ", text.replace("*", "")).strip().lower()


def plain(text: str) -> str:
    """Cell or line text without markdown emphasis, escapes and list bullets."""
    text = text.replace("\\", "")
    text = re.sub(r"^[\s•·\-\u2013]+", "", text)
    return re.sub(r"\s+", " ", re.sub(r"(\*\*|__|\*|`)", "", text)).strip()


def split_row(line: str) -> list[str]:
    body = line.strip()
    if body.startswith("|"):
        body = body[1:]
    if body.endswith("|"):
        body = body[:-1]
    return [cell.strip() for cell in body.split("|")]


def starts_table(lines: list[str], i: int) -> bool:
    """Whether a pipe table's header starts at line `i` (the next line is its separator row)."""
    if i + 1 >= len(lines) or not (lines[i].strip().startswith("|") and lines[i + 1].strip().startswith("|")):
        return False
    sep = split_row(lines[i + 1])
    return bool(sep) and all(_SEPARATOR_CELL.match(c.replace(" ", "")) for c in sep)


def parse_tables(markdown: str) -> tuple[list[Table], list[str]]:
    """All pipe tables in `markdown`, and the problems met (malformed rows).

    A `Your Method` row below a table but outside it (after blank lines or text, before the next table) belongs
    to that table. ResearchGym's materials-tokenization writer (`grading/aggregate_results.py`, `upsert_row`)
    leaves its tables so: it replaces `| Your Method | Micro-F1 | ...` with a line that brings its own newline,
    so a blank line ends the table there and the `|  | Macro-F1 | -- |` placeholder below is left outside it;
    finding no `| Your Method | Macro-F1 |` line in the table's section (from `Table N` to the next `Table`), it
    appends one at the end of the section, after the placeholder or after the blank lines before the next
    table's caption. Text between the table and such a row does not matter: the writer's section ignores it."""
    tables: list[Table] = []
    problems: list[str] = []
    lines = markdown.splitlines()
    i = 0
    while i < len(lines):
        if not starts_table(lines, i):
            i += 1
            continue
        table = Table(index=len(tables), header=split_row(lines[i]), line=i + 1)
        j = i + 2
        while j < len(lines) and lines[j].strip().startswith("|"):
            j += 1
        body = list(range(i + 2, j))
        k = j
        while k < len(lines) and not starts_table(lines, k):
            if lines[k].strip().startswith("|") and method_of(split_row(lines[k])) == YOUR_METHOD:
                body.append(k)
            k += 1
        for n in body:
            row = split_row(lines[n])
            if len(row) == len(table.header):
                table.rows.append(row)
                continue
            extra = row[len(table.header) :]
            readable = bool(extra) and not any(cell for cell in extra)
            malformed = MalformedRow(line=n + 1, method=method_of(row), cells=len(row), read=readable)
            table.malformed.append(malformed)
            problems.append(malformed.problem(table))
            if readable:  # empty cells past the header's last column: the row reads the same without them
                table.rows.append(row[: len(table.header)])
        merge_subheader(table)
        continued = fill_continuation_rows(table)
        restate_rows(table, continued)
        label_table(table, lines)
        tables.append(table)
        i = j
    return tables, problems


def merge_subheader(table: Table) -> None:
    """A header of column groups over a row of columns becomes one header (`DMC-100k (Online) Cheetah-Run`).

    ResearchGym writes such tables with the group row as the markdown header, empty cells where a group
    spans, and the columns as a first body row whose first cell is empty and which holds no numbers."""
    if not table.rows or len(table.header) < 3 or "" not in table.header[1:]:
        return
    first = table.rows[0]
    if first[0].strip() or not any(c.strip() for c in first[1:]) or any(cell_numbers(c) for c in first[1:]):
        return
    group = ""
    merged = [table.header[0]]
    for top, sub in zip(table.header[1:], first[1:], strict=True):
        group = plain(top) or group
        merged.append(" ".join(p for p in (group, plain(sub)) if p))
    table.header = merged
    table.rows = table.rows[1:]


def fill_continuation_rows(table: Table) -> set[int]:
    """A row with an empty first cell continues the method above it (one row per metric). Returns the
    indices of the rows so filled."""
    filled: set[int] = set()
    for n, (prev, row) in enumerate(zip(table.rows, table.rows[1:], strict=False), start=1):
        if not row[0].strip() and prev[0].strip():
            row[0] = prev[0]
            filled.add(n)
    return filled


def restate_rows(table: Table, continued: set[int]) -> None:
    """A `Your Method` row written out in full at the end of a table takes the place of the continuation row of
    its metric (`|  | Macro-F1 | -- |` under `| Your Method | Micro-F1 | ...`).

    `upsert_row` (see `parse_tables`) appends the rows it does not find to the end of the section; where no
    blank line splits the table first (a `Micro-F1` row it appended too, or another writer with the same
    contract), the placeholder stays in the table and the written row lands below it, and would count as one
    more `Your Method` row. It moves into the first placeholder of its metric, the row the unfilled table had,
    which `Subtask.row` counts on (the writer fills only the first such line of a section)."""
    metric_col = table.metric_column()
    if metric_col is None or not continued:
        return
    others = [n for n, row in enumerate(table.rows) if method_of(row) != YOUR_METHOD]
    trailing = range(others[-1] + 1 if others else 0, len(table.rows))
    placeholders: dict[str, int] = {}
    for n in sorted(continued):
        if method_of(table.rows[n]) == YOUR_METHOD:
            placeholders.setdefault(normalize_header(table.rows[n][metric_col]), n)
    moves = []  # (placeholder, written row): the first written row of a metric is the one the writer updates
    for n in trailing:
        target = None if n in continued else placeholders.pop(normalize_header(table.rows[n][metric_col]), None)
        if target is not None and target < n:
            moves.append((target, n))
    for target, n in reversed(moves):
        table.rows[target] = table.rows.pop(n)


def label_table(table: Table, lines: list[str]) -> None:
    """The nearest bold line or caption above the table (up to the previous table or heading) labels it;
    without either, the heading above it does, unless it is generic (`Baseline Results (to beat)`)."""
    j = table.line - 2
    while j >= 0:
        text = lines[j].strip()
        if text.startswith("|"):
            break
        heading = _HEADING.match(text)
        if heading:
            if not table.label:
                table.label, table.label_source = heading_label(heading.group(1)), "heading"
            break
        caption = _CAPTION.match(text)
        if caption and not table.caption:
            table.number, table.caption = caption.group(1), plain(caption.group(2))
            if not table.label:
                table.label, table.label_source = caption_label(table.caption), "caption"
        bold = _BOLD_LINE.match(text)
        if bold and not caption and not table.label:
            table.label, table.label_source = plain(bold.group(1) or bold.group(2)), "bold"
        j -= 1
    if not table.label:
        table.label_source = ""


# -- labels --------------------------------------------------------------------------------------------------

_GENERIC = {
    "a", "an", "and", "all", "baseline", "baselines", "benchmark", "benchmarks", "beat", "comparison",
    "comparisons", "data", "dataset", "datasets", "different", "evaluation", "experiment", "experiments",
    "main", "of", "on", "our", "performance", "result", "results", "score", "scores", "setting", "settings",
    "table", "tables", "task", "tasks", "the", "to", "various",
}  # fmt: skip
_NUMBER_WORDS = {"one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "several", "multiple"}
_SUBJECT_START = re.compile(r"\b(?:on|across)\s+(?:the\s+)?", re.IGNORECASE)
_SUBJECT_END = re.compile(
    r"\s+(?:with|under|across|after|regarding|using|for|in|at|from|over|by|via|when|where|and\s+the)\b|[(,;:]|\.(?:\s|$)",
    re.IGNORECASE,
)
_CAPTION_LABEL_WORDS = 3  # a longer subject is a description, not a name


def trim_generic(text: str) -> str:
    """`real-world datasets` -> `real-world`; `five classification tasks` -> `classification`."""
    words = text.split()
    while words and (words[0].lower() in _GENERIC | _NUMBER_WORDS or _NUMBER.fullmatch(words[0])):
        words.pop(0)
    while words and words[-1].lower().strip(".") in _GENERIC:
        words.pop()
    return " ".join(words)


def caption_label(caption: str) -> str:
    """What a caption says the table is about: the short subject after `on`/`across` in its first sentence
    (`Performance comparison on ImageNet-R across task lengths.` -> `ImageNet-R`), or "" when it has none."""
    first = re.split(r"\.\s|:\s", caption, maxsplit=1)[0]
    start = _SUBJECT_START.search(first)
    if not start:
        return ""
    subject = first[start.end() :]
    end = _SUBJECT_END.search(subject)
    subject = trim_generic(subject[: end.start()] if end else subject)
    return subject if 0 < len(subject.split()) <= _CAPTION_LABEL_WORDS else ""


def heading_label(heading: str) -> str:
    text = plain(re.sub(r"\([^)]*\)\s*$", "", heading))
    start = _SUBJECT_START.search(text)
    if start:
        subject = text[start.end() :]
        end = _SUBJECT_END.search(subject)
        text = subject[: end.start()] if end else subject
    return trim_generic(text)


def caption_words(caption: str) -> list[str]:
    """A caption's distinctive words in order (to tell apart two tables with the same label)."""
    words = re.findall(r"[a-z0-9]+", caption.lower())
    return [w for w in words if w not in _GENERIC and not w.isdigit()]


# -- numbers and metrics -------------------------------------------------------------------------------------


def first_number(cell: str) -> float | None:
    """The first number in a cell (`81.2 (0.3)` -> 81.2); None for `--` or text."""
    match = _NUMBER.search(cell.replace(",", ""))
    return float(match.group()) if match else None


def direction_of(header: str) -> str | None:
    h = header.lower()
    if "↓" in header or "lower is better" in h or "(lower" in h:
        return "lower"
    if "↑" in header or "higher is better" in h or "(higher" in h:
        return "higher"
    return None


def metric_name(header: str) -> str:
    return plain(re.sub(r"[↑↓]|\((?:lower|higher)[^)]*\)", "", header))


def header_metrics(header: str) -> list[tuple[str, str | None]]:
    """The metrics a column holds: one, or several when the header has several arrows
    (ResearchGym writes `ImageNet-R (N = 5) Acc ↑ AAA ↑` for two numbers in one cell)."""
    arrows = re.findall(r"[↑↓]", header)
    if len(arrows) < 2:
        return [(metric_name(header), direction_of(header))]
    pieces = re.split(r"[↑↓]", plain(header))[: len(arrows)]
    first_words = pieces[0].strip().rsplit(" ", 1)
    prefix = first_words[0] if len(first_words) == 2 else ""
    names = [first_words[-1]] + [p.strip() for p in pieces[1:]]
    return [
        (f"{prefix} {name}".strip(), "higher" if arrow == "↑" else "lower")
        for name, arrow in zip(names, arrows, strict=True)
    ]


def cell_numbers(cell: str) -> list[float]:
    """The numbers of a cell outside parentheses (`80.1 (0.3) 85.2 (0.1)` -> [80.1, 85.2])."""
    outside = re.sub(r"\([^)]*\)|±\s*[-+]?[\d.]+", " ", cell.replace(",", ""))
    return [float(m.group()) for m in _NUMBER.finditer(outside)]


# Metric names whose direction is a convention of the field; "@k" (Recall@1, nDCG@10) is higher too.
HIGHER_IS_BETTER = (
    "accuracy", "acc", "top-1", "top-5", "auc", "auroc", "auprc", "roc-auc", "f1", "micro-f1", "macro-f1",
    "f1 score", "precision", "recall", "map", "miou", "iou", "dice", "bleu", "rouge", "rouge-l", "meteor",
    "cider", "ndcg", "mrr", "hit rate", "hits", "return", "average return", "reward", "win rate",
    "success rate", "exact match", "psnr", "ssim", "spearman", "pearson", "correlation", "throughput", "speedup",
)  # fmt: skip
LOWER_IS_BETTER = (
    "loss", "error", "error rate", "mse", "mae", "rmse", "nll", "perplexity", "ppl", "fid", "lpips", "wer", "cer",
    "ece", "forgetting", "time", "latency", "runtime", "regret", "eer", "fpr", "bpd", "bits per dim",
)  # fmt: skip
# Phrases that hold a metric word without naming a metric.
_NOT_METRICS = re.compile(
    r"standard error|std\.? ?err\w*\.?|std\.? ?dev\w*\.?|standard deviation|time[- ]series|over time|at a time",
    re.IGNORECASE,
)
# Words too common in prose to name a caption's metric.
_PROSE_WORDS = {"time", "error", "acc", "map", "hits", "return"}


def _term_pattern(terms: tuple[str, ...] | list[str]) -> re.Pattern[str]:
    alternatives = "|".join(re.escape(t) for t in sorted(terms, key=len, reverse=True))
    return re.compile(rf"(?<![a-z0-9])(?:{alternatives})(?:e?s)?(?:@\s*\d+)?(?![a-z0-9])", re.IGNORECASE)


_HIGHER = _term_pattern(HIGHER_IS_BETTER)
_LOWER = _term_pattern(LOWER_IS_BETTER)
_AT_K = re.compile(r"[\w-]*@\s*\d+")


def conventional_direction(text: str, prose: bool = False) -> tuple[str, str] | None:
    """(direction, the metric named) when `text` names a metric of known direction, and only one direction.

    With `prose` (a caption), words that also serve as ordinary words (time, error, return) do not count
    unless written as part of a metric name."""
    text = _NOT_METRICS.sub(" ", text)
    found: list[tuple[str, str]] = []
    for direction, pattern in (("higher", _HIGHER), ("lower", _LOWER)):
        for match in pattern.finditer(text):
            term = match.group()
            if prose and {term.lower(), term.lower().removesuffix("s")} & _PROSE_WORDS:
                continue
            found.append((direction, term))
    if not found:
        at_k = _AT_K.search(text)
        return ("higher", at_k.group()) if at_k and not prose else None
    directions = {d for d, _ in found}
    return found[0] if len(directions) == 1 else None


def named_metric(text: str, known: dict[str, str]) -> tuple[str, str] | None:
    """(direction, name) of the first metric of `known` (name -> direction, from arrows) that `text` names."""
    hits = []
    for name, direction in known.items():
        match = re.search(rf"(?<![A-Za-z0-9]){re.escape(name)}(?![A-Za-z0-9])", text, re.IGNORECASE)
        if match and len(name) >= 2:
            hits.append((match.start(), direction, name))
    if not hits:
        return None
    _, direction, name = min(hits)
    return direction, name
