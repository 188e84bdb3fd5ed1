"""A qemu guest running PostgreSQL behind a tap device (the kvm-tap path).

The VM itself (image build, qemu command line, accelerator and vhost choice, readiness inside the guest) is
`pathprof.topologies.guest`; this service places it on the path: qemu runs in the topology's host namespace,
where the tap is enslaved to the bridge, and its console log goes to the run's state directory. The guest's
PostgreSQL is the run's server (`[postgres] kind = "guest"`), so readiness ends with a real `select 1` from
the host namespace to the guest's address, across bridge, tap and virtio-net.
"""
from __future__ import annotations

import ipaddress

from pathprof.errors import RequirementError
from pathprof.topologies.services import Opt, Service

PG_PORT = 5432


class QemuGuest(Service):
    kind = "qemu-guest"
    role = "qemu"
    OPTIONS = {
        "tap": Opt(str, help="the tap interface (a [[links]] kind = \"tap\" end)"),
        "address": Opt(str, help="guest address with prefix, e.g. 198.18.5.2/24"),
        "gateway": Opt(str, help="the bridge's address, the guest's default route"),
        "mac": Opt(str, "52:54:00:18:05:02"),
        "memory_mb": Opt(int, 1024),
        "cpus": Opt(int, 2),
        "ready_timeout_s": Opt((int, float), 600, help="TCG boots are slow"),
    }

    def __init__(self, spec_service):
        super().__init__(spec_service)
        self.vm = None
        self._last: dict = {}

    def _guest_module(self):
        try:
            from pathprof.topologies import guest
        except ImportError as e:
            raise RequirementError(f"the guest VM support (pathprof.topologies.guest) is not available: {e}") from None
        return guest

    def start(self, ctx) -> None:
        guest = self._guest_module()
        workdir = self.workdir(ctx)
        self.netns = ctx.host(self.host).netns
        # The image is built (minutes, once) or found in the cache; GuestImage reports progress on stderr.
        image = guest.GuestImage()
        image.ensure()
        self.vm = guest.GuestVM(image, self.opts["tap"], self.opts["address"], self.opts["gateway"], self.opts["mac"],
                                memory_mb=self.opts["memory_mb"], cpus=self.opts["cpus"],
                                console_log=workdir / "console.log", state_dir=workdir, netns=self.netns)
        self.vm.start()
        if self.vm.pid:   # journaled so `pathprof cleanup` kills a guest a crashed run left behind
            ctx.journal.record_process(self.vm.pid, ["qemu-system-x86_64", "(pathprof guest)"], self.netns)
        try:
            self.vm.wait_ready(float(self.opts["ready_timeout_s"]))
            address = str(ipaddress.ip_interface(self.opts["address"]).ip)
            port = ctx.postgres.port if ctx.postgres else PG_PORT
            self.wait_sql(ctx, address, port, timeout_s=60)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.vm is not None:
            self._last = self.vm.describe()   # reports written after teardown still say kvm/tcg and vhost
            self.vm.stop()
            self.vm = None

    def pids(self) -> list[int]:
        return [self.vm.pid] if self.vm is not None and self.vm.pid else []

    def describe(self) -> dict:
        d = super().describe()
        d.update(self.vm.describe() if self.vm is not None else self._last)  # accelerator, vhost, console_log ...
        d.setdefault("accelerator", None)
        d.setdefault("vhost", None)
        return d
