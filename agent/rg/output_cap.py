"""Keep long command output readable: the head and the tail, with what was cut in between."""

from __future__ import annotations


def cap_output(text: str, limit: int = 16_000) -> str:
    if len(text) <= limit:
        return text
    head = text[: limit // 2]
    tail = text[-limit // 2 :]
    cut = len(text) - len(head) - len(tail)
    return f"{head}\n\n[... {cut:,} characters omitted ...]\n\n{tail}"
