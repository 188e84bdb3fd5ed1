"""A small HTTP endpoint serving live figures in the OpenMetrics format for a Prometheus scrape
(`pathprof run --metrics-port N`).

`MetricsServer(port, snapshot_fn)` listens on 127.0.0.1 only (the figures describe the machine's processes;
exposing them beyond it is the operator's call, through a proxy of their choosing). GET /metrics calls
`snapshot_fn()`, which returns a summary-shaped dict (topology, tps, latency_ms, stages, cpu, ...) or None before
there is anything to report, and renders it with analysis.export.openmetrics. A port already in use is a UserError
with one clear sentence; start/stop are idempotent and stop() joins the serving thread.
"""
from __future__ import annotations

import errno
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from pathprof.analysis.export.openmetrics import CONTENT_TYPE, render
from pathprof.errors import UserError


class _Handler(BaseHTTPRequestHandler):
    server_version = "pathprof-metrics"

    def do_GET(self):  # noqa: N802 (http.server's naming)
        if self.path.split("?", 1)[0] not in ("/metrics", "/"):
            self.send_error(404, "pathprof serves /metrics only")
            return
        try:
            snap = self.server.snapshot_fn()
            body = render([snap] if snap else []).encode()
        except Exception as e:  # a scrape must never take the run down; say what failed instead
            self.send_error(500, f"snapshot failed: {type(e).__name__}: {e}")
            return
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):   # scrapes every few seconds must not flood the run's stderr
        pass


class MetricsServer:
    """Serve snapshot_fn() at http://127.0.0.1:<port>/metrics on a daemon thread; use as a context manager."""

    def __init__(self, port: int, snapshot_fn, host: str = "127.0.0.1"):
        self.port, self.host, self.snapshot_fn = port, host, snapshot_fn
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> "MetricsServer":
        if self._httpd is not None:
            return self
        try:
            httpd = ThreadingHTTPServer((self.host, self.port), _Handler)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise UserError(f"--metrics-port {self.port}: the port is already in use on {self.host}; pick "
                                "another one (or 0 for any free port)") from None
            raise UserError(f"--metrics-port {self.port}: cannot listen on {self.host}: {e.strerror}") from None
        httpd.daemon_threads = True
        httpd.snapshot_fn = self.snapshot_fn
        self._httpd = httpd
        self.port = httpd.server_address[1]
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="pathprof-metrics", daemon=True)
        self._thread.start()
        return self

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def stop(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> "MetricsServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
