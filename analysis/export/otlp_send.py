"""Where OTLP spans go: an OTLP/HTTP endpoint (protobuf, POST <endpoint>/v1/traces, through the OpenTelemetry
exporter), an OTLP/gRPC one (TraceService/Export, through the OpenTelemetry gRPC exporter; http:// for plaintext,
https:// for TLS, as that exporter takes them), or a file holding the request body for later (`-o FILE`: binary
protobuf, or OTLP/JSON when FILE ends in .json; either can be POSTed as is, e.g. `curl --data-binary @FILE -H
'Content-Type: application/x-protobuf' http://collector:4318/v1/traces`)."""
from __future__ import annotations

import json
import logging
import socket
from pathlib import Path
from urllib.parse import urlsplit

from pathprof.errors import UserError

BATCH = 2000          # spans per request: a collector's default limit on a request body is a few MiB


def request(spans):
    """The ExportTraceServiceRequest protobuf message of these spans (the OpenTelemetry encoder)."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    return encode_spans(spans)


def to_json(req) -> str:
    """OTLP/JSON of a request: the protobuf JSON mapping with trace and span ids as hex strings, as the OTLP
    specification requires (protobuf's mapping would give base64)."""
    from google.protobuf.json_format import MessageToDict
    doc = MessageToDict(req)
    for rs in doc.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for sp in ss.get("spans", []):
                for k in ("traceId", "spanId", "parentSpanId"):
                    if sp.get(k):
                        sp[k] = _b64_to_hex(sp[k])
    return json.dumps(doc, separators=(",", ":"))


def _b64_to_hex(s: str) -> str:
    import base64
    return base64.b64decode(s).hex()


def write(spans, path: Path) -> int:
    """Write the request body of all spans; returns its size in bytes."""
    req = request(spans)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = to_json(req).encode() if path.suffix == ".json" else req.SerializeToString()
    path.write_bytes(data)
    return len(data)


def traces_url(endpoint: str) -> str:
    """The traces URL of an endpoint: a bare http://host:port gets /v1/traces, as OTLP/HTTP exporters do."""
    u = urlsplit(endpoint)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise UserError(f"--endpoint {endpoint!r}: expected an OTLP/HTTP URL such as http://127.0.0.1:4318")
    return endpoint if u.path not in ("", "/") else endpoint.rstrip("/") + "/v1/traces"


def grpc_target(endpoint: str) -> tuple[str, bool]:
    """(host:port, plaintext) of an OTLP/gRPC endpoint: http://HOST:PORT (plaintext) or https://HOST:PORT (TLS)."""
    u = urlsplit(endpoint)
    if u.scheme not in ("http", "https") or not u.hostname or u.path not in ("", "/"):
        raise UserError(f"--endpoint {endpoint!r}: expected an OTLP/gRPC address such as http://127.0.0.1:4317 "
                        "(https:// for TLS)")
    return f"{u.hostname}:{u.port or (443 if u.scheme == 'https' else 80)}", u.scheme == "http"


def _exporter(endpoint: str, protocol: str, timeout: float):
    """(the OpenTelemetry span exporter, the address it sends to) for the protocol."""
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        target, plaintext = grpc_target(endpoint)
        _reachable(endpoint, timeout)
        return OTLPSpanExporter(endpoint=target, insecure=plaintext, timeout=timeout), endpoint.rstrip("/")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    url = traces_url(endpoint)
    _reachable(url, timeout)
    return OTLPSpanExporter(endpoint=url, timeout=timeout), url


def _reachable(url: str, timeout: float) -> None:
    u = urlsplit(url)
    port = u.port or (443 if u.scheme == "https" else 80)
    try:
        with socket.create_connection((u.hostname, port), timeout=timeout):
            pass
    except OSError as e:
        raise UserError(f"OTLP endpoint {url} is unreachable: {e.strerror or e}") from None


class _Last(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.last = ""

    def emit(self, record):
        self.last = record.getMessage()


def send(spans, endpoint: str, timeout: float = 5.0, protocol: str = "http") -> int:
    """Send the spans to the endpoint in batches (protocol "http": OTLP/HTTP, "grpc": OTLP/gRPC); the number of
    requests sent. UserError, one line, when the endpoint cannot be reached or refuses a batch."""
    from opentelemetry.sdk.trace.export import SpanExportResult
    exporter, url = _exporter(endpoint, protocol, timeout)
    log = logging.getLogger("opentelemetry.exporter")
    last = _Last()
    log.addHandler(last)
    prop = log.propagate
    log.propagate = False             # the reason goes into our one-line error, not a traceback-like log dump
    try:
        n = 0
        for i in range(0, len(spans), BATCH):
            if exporter.export(spans[i:i + BATCH]) != SpanExportResult.SUCCESS:
                why = " ".join(last.last.split())[:200] or "no reason given"
                raise UserError(f"OTLP endpoint {url} did not take the spans (request {n + 1}, "
                                f"{i} of {len(spans)} spans sent before): {why}")
            n += 1
        return n
    finally:
        log.removeHandler(last)
        log.propagate = prop
        exporter.shutdown()
