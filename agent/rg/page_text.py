"""An HTML page reduced to what a reader sees: its title, its text and its links (for `web_browser`).

Scripts, styles and other non-text elements are dropped; headings, list items and block elements start
new lines; `<pre>` keeps its layout. The standard library's HTML parser is lenient enough for real pages.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from html.parser import HTMLParser
from urllib.parse import urldefrag, urljoin

DROPPED = frozenset({"script", "style", "noscript", "template", "svg", "canvas", "iframe", "object", "math"})
BLOCKS = frozenset(
    {
        "address", "article", "aside", "br", "caption", "dd", "div", "dl", "dt", "fieldset", "figcaption",
        "figure", "footer", "form", "header", "hr", "li", "main", "nav", "section", "tbody", "tfoot", "thead", "tr",
    }
)  # fmt: skip
PARAGRAPHS = frozenset({"p", "pre", "blockquote", "table", "ul", "ol"})  # set off by a blank line
HEADINGS = {f"h{n}": n for n in range(1, 7)}


@dataclass
class Link:
    url: str
    text: str


@dataclass
class PageText:
    title: str = ""
    text: str = ""
    links: list[Link] = field(default_factory=list)


class _Reader(HTMLParser):
    def __init__(self, base_url: str) -> None:
        super().__init__(convert_charrefs=True)
        self.base_url = base_url
        self.parts: list[str] = []
        self.title: list[str] = []
        self.links: list[Link] = []
        self.dropped = 0  # depth inside elements whose content is not text
        self.pre = 0
        self.in_title = False
        self.anchor: tuple[str, list[str]] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in DROPPED:
            self.dropped += 1
        elif tag == "title":
            self.in_title = True
        elif tag in HEADINGS:
            self.break_line(blank=True)
            self.parts.append("#" * HEADINGS[tag] + " ")
        elif tag == "li":
            self.break_line()
            self.parts.append("- ")
        elif tag in PARAGRAPHS:
            self.break_line(blank=True)
        elif tag in BLOCKS:
            self.break_line()
        elif tag in ("td", "th") and self.parts and not self.parts[-1].endswith("\n"):
            self.parts.append(" ")
        if tag == "pre":
            self.pre += 1
        if tag == "a":
            href = dict(attrs).get("href")
            self.anchor = (href, []) if href else None

    def handle_endtag(self, tag: str) -> None:
        if tag in DROPPED:
            self.dropped = max(0, self.dropped - 1)
        elif tag == "title":
            self.in_title = False
        elif tag in PARAGRAPHS or tag in HEADINGS:
            self.break_line(blank=True)
        elif tag in BLOCKS:
            self.break_line()
        if tag == "pre":
            self.pre = max(0, self.pre - 1)
        if tag == "a" and self.anchor is not None:
            href, words = self.anchor
            self.anchor = None
            try:
                url = urldefrag(urljoin(self.base_url, href.strip())).url
            except ValueError:  # an href that is no URL at all (`http://[::1`)
                return
            if url.startswith(("http://", "https://")):
                self.links.append(Link(url=url, text=" ".join(" ".join(words).split())))

    def handle_data(self, data: str) -> None:
        if self.dropped:
            return
        if self.in_title:
            self.title.append(data)
            return
        if self.anchor is not None:
            self.anchor[1].append(data)
        if self.pre:
            self.parts.append(data)
            return
        text = re.sub(r"\s+", " ", data)
        if not self.parts or self.parts[-1].endswith("\n"):
            text = text.lstrip()
        if text:
            self.parts.append(text)

    def parse_marked_section(self, i: int, report: int = 1) -> int:
        try:
            return super().parse_marked_section(i, report)
        except AssertionError:  # a malformed `<![...]>` (the stdlib asserts on it): skip it, as browsers do
            end = self.rawdata.find(">", i)
            return -1 if end == -1 else end + 1

    def break_line(self, blank: bool = False) -> None:
        """Start a new line (after a blank one if `blank`), unless the text already does."""
        if not self.parts:
            return
        tail = "".join(self.parts[-4:]).rstrip(" ")
        have = len(tail) - len(tail.rstrip("\n"))
        missing = (2 if blank else 1) - have
        if missing > 0:
            self.parts.append("\n" * missing)


def page_text(html: str, base_url: str) -> PageText:
    """The title, readable text and links (absolute http(s) URLs, each once) of an HTML page."""
    reader = _Reader(base_url)
    reader.feed(html)
    reader.close()
    lines = [line.rstrip() for line in "".join(reader.parts).split("\n")]
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip("\n")
    seen: set[str] = set()
    links = [link for link in reader.links if not (link.url in seen or seen.add(link.url))]
    return PageText(title=" ".join("".join(reader.title).split()), text=text, links=links)
