"""Docker's userland proxy, started the way dockerd starts it.

dockerd (libnetwork/portmapper, 20.10 and 23+) runs, for each published port,
    docker-proxy -proto tcp -host-ip H -host-port P -container-ip C -container-port Q
with one extra file: the write end of a pipe as fd 3 (exec.Cmd.ExtraFiles). The proxy binds the host port and
writes "0\\n" there when it listens, or "1\\n<error>" and exits. dockerd closes its copy of the write end, reads
two bytes, treats anything but "0\\n" as failure (the rest of the pipe is the error text), gives up after 16 s,
and stops the proxy with SIGINT. We do the same, so the hop measured is exactly the one a Docker host has.
Not reproduced: dockerd's Pdeathsig (SIGTERM to the proxy if dockerd dies) — our journal kills the proxy
instead, and a parent-death signal would fire whenever the (possibly short-lived) starting thread exits.
"""
from __future__ import annotations

import os
import select
import signal
import time

from pathprof.agent.host import proc
from pathprof.topologies.services import Opt, Service

READY_TIMEOUT_S = 16.0     # dockerd's own bound (portmapper proxyCommand.Start)


class DockerProxy(Service):
    kind = "docker-proxy"
    role = "proxy"
    stop_signal = signal.SIGINT
    OPTIONS = {
        "proto": Opt(str, "tcp", ("tcp",), "only TCP carries PostgreSQL"),
        "host_ip": Opt(str, "0.0.0.0", help="address the published port binds; dockerd's default is 0.0.0.0"),
        "host_port": Opt(int, help="the published port"),
        "container_ip": Opt(str, help="the container's address"),
        "container_port": Opt(int, 5432),
    }

    def argv(self) -> list[str]:
        o = self.opts
        return [proc.which("docker-proxy"), "-proto", o["proto"], "-host-ip", o["host_ip"],
                "-host-port", str(o["host_port"]), "-container-ip", o["container_ip"],
                "-container-port", str(o["container_port"])]

    def start(self, ctx) -> None:
        self.workdir(ctx)
        r, w = os.pipe()
        try:
            # The write end must be fd 3 in the proxy. A shell that execs the proxy with `3>&W W>&-` puts it
            # there without a preexec_fn (unsafe in a threaded parent); `ip netns exec` keeps inherited fds.
            # bash, not sh: dash refuses fd numbers above 9 ("Bad fd number"), and with the probes loading
            # meanwhile (their BPF fds) the pipe's end is often above 9.
            self.spawn(ctx, ["/bin/bash", "-c", f'exec "$@" 3>&{w} {w}>&-', "docker-proxy", *self.argv()],
                       pass_fds=(w,))
        except BaseException:
            os.close(r)
            raise
        finally:
            os.close(w)   # as dockerd does: only the proxy holds the write end, so its exit gives us EOF
        try:
            status = self._read_status(r)
        finally:
            os.close(r)
        if status != "0\n":
            detail = status[2:].strip() if status.startswith("1\n") else status.strip()
            raise self.fail(f"Error starting userland proxy: {detail or 'it exited without a status'}")

    def _read_status(self, r: int) -> str:
        deadline = time.monotonic() + READY_TIMEOUT_S
        buf = b""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([r], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            chunk = os.read(r, 4096)
            if not chunk:
                return buf.decode(errors="replace")      # EOF: the proxy exited; buf holds its error, if any
            buf += chunk
            if buf == b"0\n" or (len(buf) >= 2 and buf[:2] != b"0\n" and buf[:2] != b"1\n"):
                return buf.decode(errors="replace")
            # "1\n..." : keep reading the error text until EOF
        if buf == b"0\n":
            return "0\n"
        raise self.fail(f"Timed out proxy starting the userland proxy (no status on fd 3 within "
                        f"{READY_TIMEOUT_S:.0f} s)")

    def describe(self) -> dict:
        d = super().describe()
        d["argv"] = self.argv()
        return d
