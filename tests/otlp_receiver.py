"""A small OTLP/HTTP trace receiver for the tests: http.server on 127.0.0.1, POST /v1/traces decoded with the
protocol's own protobuf classes (opentelemetry-proto's ExportTraceServiceRequest), binary protobuf or OTLP/JSON.
Answers as the OTLP/HTTP specification says: 200 with an ExportTraceServiceResponse, or the status it is told
to give (`status`) to test a refusal."""
from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf.json_format import Parse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


def _any(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def flatten(req: ExportTraceServiceRequest) -> list[dict]:
    """One dict per span: ids as hex (parent "" for a root), name, start/end ns, attributes, resource."""
    out = []
    for rs in req.resource_spans:
        res = {a.key: _any(a.value) for a in rs.resource.attributes}
        for ss in rs.scope_spans:
            for sp in ss.spans:
                out.append({"trace_id": sp.trace_id.hex(), "span_id": sp.span_id.hex(),
                            "parent": sp.parent_span_id.hex(), "name": sp.name,
                            "start": sp.start_time_unix_nano, "end": sp.end_time_unix_nano,
                            "attrs": {a.key: _any(a.value) for a in sp.attributes}, "resource": res,
                            "scope": ss.scope.name})
    return out


def parse_json(body: bytes) -> ExportTraceServiceRequest:
    """OTLP/JSON (hex ids) -> the request (protobuf's JSON mapping wants base64 for bytes)."""
    doc = json.loads(body)
    for rs in doc.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for sp in ss.get("spans", []):
                for k in ("traceId", "spanId", "parentSpanId"):
                    if sp.get(k):
                        sp[k] = base64.b64encode(bytes.fromhex(sp[k])).decode()
    return Parse(json.dumps(doc), ExportTraceServiceRequest())


class Receiver:
    def __init__(self, status: int = 200):
        self.requests: list[ExportTraceServiceRequest] = []
        self.content_types: list[str] = []
        self.status = status
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):                       # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path != "/v1/traces":
                    self.send_error(404)
                    return
                ctype = self.headers.get("Content-Type", "")
                req = parse_json(body) if "json" in ctype else ExportTraceServiceRequest.FromString(body)
                if outer.status != 200:
                    self.send_response(outer.status)
                    self.end_headers()
                    return
                outer.requests.append(req)
                outer.content_types.append(ctype)
                data = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def spans(self) -> list[dict]:
        return [s for r in self.requests for s in flatten(r)]

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def need_grpc() -> None:
    """Skip a gRPC test in a .venv made before the gRPC exporter was a dependency (re-run scripts/setup.sh);
    in CI (CI=true, a fresh .venv) a missing exporter is a failure, not a skip."""
    import importlib.util
    import os

    import pytest
    if importlib.util.find_spec("opentelemetry.exporter.otlp.proto.grpc") is None and not os.environ.get("CI"):
        pytest.skip("opentelemetry-exporter-otlp-proto-grpc is not installed in this .venv: re-run scripts/setup.sh")


class GrpcReceiver:
    """The same over OTLP/gRPC: a grpcio server on 127.0.0.1 serving the protocol's own TraceService
    (opentelemetry-proto's trace_service_pb2_grpc), decoding each Export request; `code` (a grpc.StatusCode)
    makes it refuse every request, to test a refusal."""

    def __init__(self, code=None):
        from concurrent import futures

        import grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as svc
        self.requests: list[ExportTraceServiceRequest] = []
        self.metadata: list[dict] = []
        outer = self

        class Service(svc.TraceServiceServicer):
            def Export(self, request, context):          # noqa: N802 (the service's name)
                if code is not None:
                    context.abort(code, "refused by the test receiver")
                outer.requests.append(request)
                outer.metadata.append(dict(context.invocation_metadata()))
                return ExportTraceServiceResponse()

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        svc.add_TraceServiceServicer_to_server(Service(), self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.url = f"http://127.0.0.1:{port}"

    def spans(self) -> list[dict]:
        return [s for r in self.requests for s in flatten(r)]

    def __enter__(self):
        self.server.start()
        return self

    def __exit__(self, *exc):
        self.server.stop(grace=None)
