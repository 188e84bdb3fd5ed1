"""Any proxy a user puts on the path: `kind = "command"` in a user-written spec.

    [[services]]
    kind = "command"
    host = "proxy"
    name = "haproxy"                      # the hop's name in reports
    argv = ["/usr/sbin/haproxy", "-db", "-f", "/etc/pp-haproxy.cfg"]
    ready_port = 7432                     # ready when a TCP connection to ready_address:ready_port succeeds
    ready_address = "198.18.9.2"

`argv` may use {state_dir}, {hop_dir}, {postgres_address}, {postgres_port}; write {{ and }} for literal braces.
The command must stay in the foreground: its pid is the hop the probes track, and it is stopped with SIGTERM
(then SIGKILL) when the run ends.
"""
from __future__ import annotations

import time

from pathprof.errors import UserError
from pathprof.topologies.services import Opt, Service, tcp_open


class Command(Service):
    kind = "command"
    role = "proxy"
    OPTIONS = {
        "argv": Opt(list, help="the command line, as a list of strings"),
        "ready_port": Opt(int, help="TCP port that accepts connections once the command is ready"),
        "ready_address": Opt(str, "127.0.0.1"),
        "ready_timeout_s": Opt((int, float), 30),
        "user": Opt(str, "", help="run as this user (empty: root)"),
        "sql_check": Opt(bool, False, help="also require a `select 1` through ready_address:ready_port"),
    }

    def expand(self, ctx, workdir) -> list[str]:
        pg = ctx.postgres
        fields = {"state_dir": str(ctx.state_dir), "hop_dir": str(workdir),
                  "postgres_address": pg.address if pg and pg.address else "",
                  "postgres_port": str(pg.port) if pg else ""}
        try:
            return [a.format_map(fields) for a in self.opts["argv"]]
        except (KeyError, ValueError) as e:
            raise UserError(f"service '{self.hop}': argv: bad placeholder {e} (known: "
                            f"{', '.join('{' + k + '}' for k in fields)}; write {{{{ for a literal brace)") from None

    def start(self, ctx) -> None:
        if not self.opts["argv"]:
            raise UserError(f"service '{self.hop}': argv is empty")
        workdir = self.workdir(ctx, owner=self.opts["user"] or None)
        self.spawn(ctx, self.expand(ctx, workdir), user=self.opts["user"] or None)
        addr, port = self.opts["ready_address"], self.opts["ready_port"]
        deadline = time.monotonic() + float(self.opts["ready_timeout_s"])
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise self.fail(f"exited with status {self.popen.returncode} while starting")
            if tcp_open(self.netns, addr, port):
                if self.opts["sql_check"]:
                    self.wait_sql(ctx, addr, port, max(1.0, deadline - time.monotonic()))
                return
            time.sleep(0.1)
        raise self.fail(f"nothing accepted connections on {addr}:{port} within {self.opts['ready_timeout_s']} s")

    def describe(self) -> dict:
        d = super().describe()
        d["argv"] = list(self.opts["argv"])
        return d
