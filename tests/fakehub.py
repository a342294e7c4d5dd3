"""A fake Hugging Face Hub: enough of its wire protocol for the real `huggingface_hub` client.

`FakeHub` is a local HTTP/1.1 server on 127.0.0.1 (a free port). Point the client at it with
`HF_ENDPOINT=hub.base_url`; `hf_hub_download` and `snapshot_download` then fetch from it into the usual cache.

    with FakeHub() as hub:
        hub.add_file("org/data", "train.csv", b"x,y\\n1,2\\n", repo_type="dataset")
        hub.add_file("org/model", "weights.bin", b"\\0" * 1024, lfs=True)  # served through a CDN-style redirect
        env = {**os.environ, "HF_ENDPOINT": hub.base_url}
        ...
        hub.requests   # every request: Recorded(method, path, headers)
        hub.downloads  # the file contents served: "dataset:org/data/train.csv", ...

It answers, as the Hub does (read from huggingface_hub 2.4's `file_download.py`, `utils/_http.py`, `hf_api.py` and
`_snapshot_download.py`):

- `HEAD|GET /{repo_id}/resolve/{revision}/{path}` (models), `/datasets/{repo_id}/resolve/...`, `/spaces/...`:
  a regular file answers 200 with `X-Repo-Commit` (the commit the revision resolves to; without it the client
  refuses the endpoint), `ETag` (the git blob sha1; the cache's blob name) and `Content-Length` (the size the client
  checks the body against). An `lfs=True` file answers `302` with `Location` on another origin
  (`http://localhost:PORT/cdn/<sha256>`, standing for the CDN), `X-Linked-Etag` (its sha256) and `X-Linked-Size`:
  the client takes the metadata from the redirect and GETs the location without following further. The
  revision may be a branch (`main`) or the commit's 40-hex sha.
- `GET /cdn/{sha256}`: an LFS file's content.
- `GET /api/{models|datasets|spaces}/{repo_id}[/revision/{revision}]`: the repo's info (`sha`, `siblings`), which
  `snapshot_download` asks first;
- `GET /api/{...}s/{repo_id}/tree/{revision}[/{path}]?recursive=`: the file listing (`type`, `path`, `oid`, `size`,
  `lfs`), in one page (no `Link: next`).
- Errors carry `X-Error-Code` (`RepoNotFound`, `RevisionNotFound`, `EntryNotFound`), which the client turns into its
  typed errors. Other paths answer 404: huggingface_hub 2.x GETs `/api/agent-harnesses` once per process when online
  and takes a 404 as no registry (it is in `requests`, not in `downloads`).

No Xet headers are ever sent (`X-Xet-Hash`), so the client downloads over plain HTTP even with `hf_xet` installed.
Ranges are not honoured (a 200 to a ranged request is handled by the client: it restarts the file).
Stopping the server (leaving the `with`) closes the port: the client then sees connection refused, as without network.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any, NamedTuple
from urllib.parse import unquote, urlsplit

from local_http import LocalHTTPServer

REPO_TYPES = {"models": "model", "datasets": "dataset", "spaces": "space"}
URL_PREFIX = {"model": "", "dataset": "datasets/", "space": "spaces/"}


class Recorded(NamedTuple):
    method: str
    path: str  # without the query, not unquoted
    headers: dict[str, str]  # lower-cased names


@dataclass
class HubFile:
    content: bytes
    lfs: bool = False

    @property
    def git_sha1(self) -> str:
        """The blob id git gives the content (the Hub's ETag for a regular file)."""
        return hashlib.sha1(b"blob %d\0" % len(self.content) + self.content).hexdigest()

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content).hexdigest()

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.git_sha1


@dataclass
class HubRepo:
    repo_type: str
    repo_id: str
    files: dict[str, HubFile] = field(default_factory=dict)

    @property
    def commit(self) -> str:
        """A 40-hex commit id that changes whenever a file does."""
        h = hashlib.sha1(f"{self.repo_type}:{self.repo_id}".encode())
        for name in sorted(self.files):
            h.update(name.encode() + b"\0" + self.files[name].etag.encode())
        return h.hexdigest()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: LocalHTTPServer

    def do_GET(self) -> None:
        self.server.owner._handle(self)

    do_HEAD = do_GET

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def answer(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(len(body)), **(headers or {})}
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def answer_json(self, data: Any) -> None:
        self.answer(200, json.dumps(data).encode(), {"Content-Type": "application/json"})

    def error(self, status: int, code: str, message: str, commit: str | None = None) -> None:
        headers = {"Content-Type": "application/json", "X-Error-Code": code, "X-Error-Message": message}
        if commit is not None:
            headers["X-Repo-Commit"] = commit
        self.answer(status, json.dumps({"error": message}).encode(), headers)


class FakeHub:
    """The fake Hub; a context manager (or `start()` / `stop()`). See the module docstring."""

    def __init__(self) -> None:
        self._repos: dict[tuple[str, str], HubRepo] = {}
        self._requests: list[Recorded] = []
        self._downloads: list[str] = []
        self._lock = threading.Lock()
        self._httpd: LocalHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._port: int | None = None

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> FakeHub:
        self._httpd = LocalHTTPServer(self, _Handler)
        self._port = self._httpd.server_address[1]
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="fakehub", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the port (idempotent): from now on the client's connections are refused."""
        if self._httpd is None or self._thread is None:
            return
        self._httpd.shutdown()
        self._httpd.drop_connections()
        self._httpd.server_close()
        self._thread.join()
        self._httpd = self._thread = None

    @property
    def running(self) -> bool:
        return self._httpd is not None

    @property
    def base_url(self) -> str:
        """`HF_ENDPOINT` for the client (still the old address once stopped: a closed port)."""
        assert self._port is not None, "start the hub first"
        return f"http://127.0.0.1:{self._port}"

    def add_file(
        self, repo_id: str, path: str, content: bytes | str, *, repo_type: str = "model", lfs: bool = False
    ) -> str:
        """Add (or replace) a file; returns the repo's new commit id."""
        assert repo_type in URL_PREFIX, f"repo_type must be one of {sorted(URL_PREFIX)}"
        data = content.encode() if isinstance(content, str) else content
        with self._lock:
            repo = self._repos.setdefault((repo_type, repo_id), HubRepo(repo_type, repo_id))
            repo.files[path] = HubFile(data, lfs)
            return repo.commit

    def commit(self, repo_id: str, *, repo_type: str = "model") -> str:
        with self._lock:
            return self._repos[(repo_type, repo_id)].commit

    @property
    def requests(self) -> list[Recorded]:
        with self._lock:
            return list(self._requests)

    @property
    def downloads(self) -> list[str]:
        """The file contents served (GET bodies, not HEADs), as `<repo_type>:<repo_id>/<path>`, in order."""
        with self._lock:
            return list(self._downloads)

    # Serving.

    def _handle(self, handler: _Handler) -> None:
        path = urlsplit(handler.path).path
        with self._lock:
            self._requests.append(Recorded(handler.command, path, {k.lower(): v for k, v in handler.headers.items()}))
        if path.startswith("/api/"):
            if handler.command != "GET":
                return handler.error(405, "MethodNotAllowed", f"{handler.command} {path}")
            return self._api(handler, path.removeprefix("/api/"))
        if path.startswith("/cdn/"):
            return self._cdn(handler, path.removeprefix("/cdn/"))
        if "/resolve/" in path:
            return self._resolve(handler, path.lstrip("/"))
        handler.error(404, "RepoNotFound", f"no route {path}")

    def _find(self, repo_type: str, repo_id: str, revision: str) -> tuple[HubRepo | None, str | None]:
        """The repo and the error code when it or the revision is unknown."""
        with self._lock:
            repo = self._repos.get((repo_type, repo_id))
        if repo is None:
            return None, "RepoNotFound"
        if revision not in ("main", repo.commit):
            return repo, "RevisionNotFound"
        return repo, None

    def _resolve(self, handler: _Handler, path: str) -> None:
        repo_part, _, rest = path.partition("/resolve/")
        repo_type = "model"
        for kind, prefix in URL_PREFIX.items():
            if prefix and repo_part.startswith(prefix):
                repo_type, repo_part = kind, repo_part.removeprefix(prefix)
        revision, _, filename = rest.partition("/")
        revision, filename = unquote(revision), unquote(filename)
        repo, problem = self._find(repo_type, unquote(repo_part), revision)
        if problem is not None:
            return handler.error(404, problem, f"{repo_type} {repo_part}@{revision}: {problem}")
        assert repo is not None
        hub_file = repo.files.get(filename)
        if hub_file is None:
            return handler.error(404, "EntryNotFound", f"{filename} not in {repo_part}", commit=repo.commit)
        headers = {"X-Repo-Commit": repo.commit, "Accept-Ranges": "bytes"}
        if hub_file.lfs:
            cdn = f"http://localhost:{self._port}/cdn/{hub_file.sha256}"
            headers |= {
                "Location": cdn,
                "X-Linked-Etag": f'"{hub_file.sha256}"',
                "X-Linked-Size": str(len(hub_file.content)),
                "ETag": f'"{hub_file.git_sha1}"',
            }
            return handler.answer(302, b"", headers)
        if handler.command == "GET":
            with self._lock:
                self._downloads.append(f"{repo_type}:{repo.repo_id}/{filename}")
        handler.answer(200, hub_file.content, headers | {"ETag": f'"{hub_file.git_sha1}"'})

    def _cdn(self, handler: _Handler, sha256: str) -> None:
        with self._lock:
            found = [
                (repo, name, f)
                for repo in self._repos.values()
                for name, f in repo.files.items()
                if f.lfs and f.sha256 == sha256
            ]
        if not found:
            return handler.error(404, "EntryNotFound", f"no blob {sha256}")
        repo, name, hub_file = found[0]
        if handler.command == "GET":
            with self._lock:
                self._downloads.append(f"{repo.repo_type}:{repo.repo_id}/{name}")
        handler.answer(200, hub_file.content, {"ETag": f'"{sha256}"'})

    def _api(self, handler: _Handler, path: str) -> None:
        kind, _, rest = path.partition("/")
        repo_type = REPO_TYPES.get(kind)
        if repo_type is None:
            return handler.error(404, "RepoNotFound", f"no API {kind}")
        revision, sub = "main", ""
        for marker in ("/revision/", "/tree/"):
            if marker in rest:
                rest, _, tail = rest.partition(marker)
                revision, _, sub = tail.partition("/")
                sub = f"{marker.strip('/')}:{unquote(sub)}"
                break
        repo, problem = self._find(repo_type, unquote(rest), unquote(revision))
        if problem is not None:
            return handler.error(404, problem, f"{repo_type} {rest}@{revision}: {problem}")
        assert repo is not None
        if sub.startswith("tree:"):
            return handler.answer_json(self._tree(repo, sub.removeprefix("tree:"), "recursive=true" in handler.path))
        handler.answer_json(
            {
                "id": repo.repo_id,
                "sha": repo.commit,
                "private": False,
                "siblings": [{"rfilename": name} for name in sorted(repo.files)],
            }
        )

    def _tree(self, repo: HubRepo, folder: str, recursive: bool) -> list[dict[str, Any]]:
        prefix = f"{folder.strip('/')}/" if folder.strip("/") else ""
        entries: list[dict[str, Any]] = []
        folders: set[str] = set()
        for name in sorted(repo.files):
            if not name.startswith(prefix):
                continue
            parents = name.removeprefix(prefix).split("/")[:-1]  # the folders between `folder` and the file
            if parents and not recursive:
                folders.add(prefix + parents[0])
                continue
            folders.update(prefix + "/".join(parents[: i + 1]) for i in range(len(parents)))
            f = repo.files[name]
            entry: dict[str, Any] = {"type": "file", "oid": f.git_sha1, "size": len(f.content), "path": name}
            if f.lfs:
                entry["lfs"] = {"oid": f.sha256, "size": len(f.content), "pointerSize": 130}
            entries.append(entry)
        dirs = [{"type": "directory", "oid": hashlib.sha1(d.encode()).hexdigest(), "path": d} for d in sorted(folders)]
        return dirs + entries
