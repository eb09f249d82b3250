"""A package index for tests: real wheels built here, served over HTTP on this machine with the
simple API (PEP 503 HTML, or PEP 691 JSON when asked), counting what it served."""

from __future__ import annotations

import base64
import hashlib
import html
import json
import threading
import zipfile
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

JSON_TYPE = "application/vnd.pypi.simple.v1+json"


def build_wheel(
    directory: Path,
    name: str,
    version: str,
    module_source: str,
    tag: str = "py3-none-any",
    requires: Sequence[str] = (),
) -> Path:
    """A minimal, valid wheel of one module `name` (dist-info with METADATA, WHEEL and RECORD),
    declaring `requires` as its Requires-Dist."""
    dist = f"{name}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
    files = {
        f"{name}.py": module_source.encode(),
        f"{dist}/METADATA": metadata.encode(),
        f"{dist}/WHEEL": (
            f"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: {tag}\n".encode()
        ),
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    out = directory / f"{name}-{version}-{tag}.whl"
    with zipfile.ZipFile(out, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
    return out


@dataclass
class PackageIndex:
    url: str
    wheels: dict[str, list[Path]]  # project name -> its wheel files
    served: Counter[str] = field(default_factory=Counter)  # request paths
    # Wheels whose advertised sha256 is wrong (a tampered mirror).
    lie_about: set[str] = field(default_factory=set)
    speaks_json: bool = True  # False: PEP 503 HTML only, as older mirrors serve
    # File name -> the URL the index gives for it instead of its own (a hostile mirror).
    urls: dict[str, str] = field(default_factory=dict)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@contextmanager
def serve_index(host: str, wheels: dict[str, list[Path]]) -> Iterator[PackageIndex]:
    """Serve `wheels` at http://host:PORT/simple/<project>/ and the files at /files/<name>."""
    index = PackageIndex("", wheels)
    by_file = {p.name: p for paths in wheels.values() for p in paths}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            index.served[self.path] += 1
            parts = self.path.strip("/").split("/")
            if len(parts) == 2 and parts[0] == "files" and parts[1] in by_file:
                self._send(200, by_file[parts[1]].read_bytes(), "application/octet-stream")
            elif len(parts) == 2 and parts[0] == "simple" and parts[1] in index.wheels:
                files = [
                    (p.name, "0" * 64 if p.name in index.lie_about else _sha256(p))
                    for p in index.wheels[parts[1]]
                ]
                if index.speaks_json and JSON_TYPE in self.headers.get("Accept", ""):
                    body = {
                        "meta": {"api-version": "1.0"},
                        "name": parts[1],
                        "files": [
                            {
                                "filename": n,
                                "url": index.urls.get(n, f"../../files/{n}"),
                                "hashes": {"sha256": h},
                            }
                            for n, h in files
                        ],
                    }
                    self._send(200, json.dumps(body).encode(), JSON_TYPE)
                else:
                    links = "".join(
                        f'<a href="{html.escape(index.urls.get(n, f"../../files/{n}"))}#sha256={h}">'
                        f"{html.escape(n)}</a><br>"
                        for n, h in files
                    )
                    self._send(200, f"<!DOCTYPE html><html><body>{links}</body></html>".encode(), "text/html")
            else:
                self._send(404, b"not found", "text/plain")

    server = ThreadingHTTPServer((host, 0), Handler)
    index.url = f"http://{host}:{server.server_address[1]}/simple/"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield index
    finally:
        server.shutdown()
        server.server_close()
