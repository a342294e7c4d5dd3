"""`web_search` (behind a pluggable backend) and `web_browser`; both off unless configured.

A backend is chosen by `LABKUBE_WEB_SEARCH`:
- unset or `off`: no web tools are offered (the default: runs are offline);
- `searxng:http://host:8080`: a SearXNG instance's JSON API (`/search?q=...&format=json`), and with it
  `web_browser`, which opens a page and returns its text.
URLs in the task's blocked list are dropped from search results and refused by `web_browser`, also when a
redirect leads to them: each hop is checked before it is requested.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urljoin

import httpx
from pydantic import BaseModel

from labkube.agent.blocked_urls import is_blocked
from labkube.agent.rg.output_cap import cap_output
from labkube.agent.rg.page_text import page_text
from labkube.agent.rg.tool import Tool, ToolError, tool
from labkube.agent.rg.tools import ToolContext
from labkube.settings import WEB_SEARCH


class SearchHit(BaseModel):
    url: str
    title: str = ""
    snippet: str = ""


class SearchBackend(Protocol):
    async def search(self, query: str, limit: int) -> list[SearchHit]: ...


class SearxngBackend:
    def __init__(self, base_url: str, timeout_s: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s

    async def search(self, query: str, limit: int) -> list[SearchHit]:
        async with httpx.AsyncClient(timeout=self.timeout_s) as client:
            try:
                resp = await client.get(f"{self.base_url}/search", params={"q": query, "format": "json"})
                resp.raise_for_status()
                data = resp.json()
            except (httpx.HTTPError, ValueError) as exc:
                raise ToolError(f"web search failed: {type(exc).__name__}: {str(exc)[:200]}") from None
        hits = [
            SearchHit(url=r.get("url", ""), title=r.get("title", ""), snippet=r.get("content", ""))
            for r in data.get("results", [])
            if isinstance(r, dict) and r.get("url")
        ]
        return hits[:limit]


def backend_from_env() -> SearchBackend | None:
    url = WEB_SEARCH.read()
    return SearxngBackend(url) if url is not None else None


@tool(access="read")
def web_search(ctx: ToolContext, backend: SearchBackend):
    async def execute(query: str, max_results: int = 8) -> str:
        """Search the web; returns titles, URLs and snippets (open one with web_browser). Blocked sources are
        left out.

        Args:
            query: What to search for.
            max_results: How many results to return at most.
        """
        hits = await backend.search(query, max_results * 2)
        allowed = [h for h in hits if not is_blocked(h.url, ctx.blocked_urls)]
        dropped = len(hits) - len(allowed)
        lines = [f"{i}. {h.title}\n   {h.url}\n   {h.snippet[:300]}" for i, h in enumerate(allowed[:max_results], 1)]
        note = f"\n[{dropped} result(s) from blocked sources left out]" if dropped else ""
        return ("\n".join(lines) or "no results") + note

    return execute


MAX_PAGE_BYTES = 5_000_000
MAX_REDIRECTS = 10
MAX_LINKS = 100
TEXT_TYPES = ("text/", "application/json", "application/xml", "application/javascript", "+json", "+xml")


@dataclass(frozen=True)
class Fetched:
    """A page as web_browser got it: where it ended up, and its body (cut at MAX_PAGE_BYTES)."""

    url: str
    status: int
    content_type: str
    body: str
    cut: bool
    redirects: int


def refuse_blocked_url(ctx: ToolContext, url: str, asked: str) -> None:
    """Refuse `url` if it is blocked; `asked` is the URL the agent gave, when `url` is a redirect's target."""
    pattern = is_blocked(url, ctx.blocked_urls)
    if pattern is None:
        return
    what = url if url == asked else f"{asked} redirects to {url}, which"
    raise ToolError(f"{what} is blocked for this task (matches {pattern!r}); find another source")


def text_encoding(resp: httpx.Response) -> str:
    """The charset the server names, if Python knows it; UTF-8 otherwise."""
    name = resp.charset_encoding or "utf-8"
    try:
        codecs.lookup(name)
    except LookupError:
        return "utf-8"
    return name


async def fetch_allowed(ctx: ToolContext, url: str) -> Fetched:
    """GET `url`, following redirects by hand so that no blocked URL is ever requested."""
    current = url
    async with httpx.AsyncClient(timeout=ctx.timeout(60), follow_redirects=False) as client:
        for hop in range(MAX_REDIRECTS + 1):
            refuse_blocked_url(ctx, current, url)
            if not current.lower().startswith(("http://", "https://")):
                raise ToolError(f"{current}: only http(s) URLs can be opened")
            try:
                async with client.stream("GET", current, headers={"User-Agent": "labkube-web-browser"}) as resp:
                    if resp.is_redirect:
                        current = urljoin(str(resp.url), resp.headers["location"])
                        continue
                    data = bytearray()
                    async for chunk in resp.aiter_bytes():
                        data += chunk
                        if len(data) > MAX_PAGE_BYTES:
                            break
                    return Fetched(
                        url=str(resp.url),
                        status=resp.status_code,
                        content_type=resp.headers.get("content-type", "").split(";")[0].strip().lower(),
                        body=bytes(data[:MAX_PAGE_BYTES]).decode(text_encoding(resp), errors="replace"),
                        cut=len(data) > MAX_PAGE_BYTES,
                        redirects=hop,
                    )
            except (httpx.HTTPError, httpx.InvalidURL) as exc:
                raise ToolError(f"could not open {current}: {type(exc).__name__}: {str(exc)[:200]}") from None
    raise ToolError(f"{url}: more than {MAX_REDIRECTS} redirects; giving up")


def readable(ctx: ToolContext, page: Fetched) -> tuple[str, str]:
    """The page's title and its text for the agent: HTML reduced to text plus its allowed links."""
    looks_html = page.body.lstrip()[:200].lower().startswith(("<!doctype html", "<html"))
    if page.content_type in ("text/html", "application/xhtml+xml") or (not page.content_type and looks_html):
        parsed = page_text(page.body, page.url)
        allowed = [link for link in parsed.links if not is_blocked(link.url, ctx.blocked_urls)]
        lines = [f"- {link.text or '(no text)'}: {link.url}" for link in allowed[:MAX_LINKS]]
        if len(allowed) > MAX_LINKS:
            lines.append(f"[{len(allowed) - MAX_LINKS} more links]")
        if len(allowed) < len(parsed.links):
            lines.append(f"[{len(parsed.links) - len(allowed)} link(s) to blocked sources left out]")
        links = "\n\nLinks:\n" + "\n".join(lines) if lines else ""
        return parsed.title, parsed.text + links
    if not page.content_type or any(t in page.content_type for t in TEXT_TYPES):
        return "", page.body
    raise ToolError(
        f"{page.url} is {page.content_type}, not a text page; download it with bash (curl -L -o) and convert it "
        "(pdftotext, python)"
    )


@tool(access="read")
def web_browser(ctx: ToolContext):
    async def execute(url: str, page: int = 1) -> str:
        """Open a web page and return its readable text (scripts, styles and markup dropped) and its links,
        a part at a time for long pages. The task's blocked sources are refused, also behind redirects.

        Args:
            url: An http(s) URL.
            page: Which part of a long page to show (1-based).
        """
        if page < 1:
            raise ToolError(f"page must be 1 or more (got {page})")
        fetched = await fetch_allowed(ctx, url)
        title, text = readable(ctx, fetched)
        size = max(1000, ctx.output_limit * 3 // 4)  # room for the header within the output cap
        parts = max(1, -(-len(text) // size))
        if page > parts:
            raise ToolError(f"page {page} is past the end: {fetched.url} has {parts} part(s) of text")
        head = [f"[HTTP {fetched.status}] {fetched.url}"]
        if fetched.redirects:
            head.append(f"(redirected from {url})")
        if title:
            head.append(f"Title: {title}")
        if parts > 1:
            more = f"; continue with page={page + 1}" if page < parts else ""
            head.append(f"[part {page} of {parts}{more}]")
        if fetched.cut:
            head.append(f"[the page is larger than {MAX_PAGE_BYTES:,} bytes; only its start was read]")
        body = text[(page - 1) * size : page * size]
        return cap_output("\n".join(head) + "\n\n" + body, ctx.output_limit)

    return execute


def web_tools(ctx: ToolContext) -> list[Tool]:
    """No web tools unless a search backend is configured: runs are offline by default."""
    backend = backend_from_env()
    if backend is None:
        return []
    return [web_search(ctx, backend), web_browser(ctx)]
