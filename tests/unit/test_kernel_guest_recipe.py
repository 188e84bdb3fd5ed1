"""The kernel guest's cache key and command file (topologies/guest/kernel_guest.py), without building or booting."""
import pytest
from pathprof.errors import UserError
from pathprof.topologies.guest.kernel_guest import DISK_INIT, KernelGuest


def test_each_suite_has_its_own_cache_entry(tmp_path):
    keys = {s: KernelGuest(s, cache_root=tmp_path).key for s in ("bullseye", "bookworm", "trixie")}
    assert len(set(keys.values())) == 3 and all(k.startswith(s + "-") for s, k in keys.items())
    assert KernelGuest("bookworm", cache_root=tmp_path).path.parent == tmp_path


def test_an_unknown_suite_is_refused_with_the_known_ones():
    with pytest.raises(UserError, match="bullseye, bookworm, trixie"):
        KernelGuest("sid")


def test_the_init_runs_the_commands_file_and_powers_off():
    # the host reads the commands' exit status from rc and their output from output.log, both in the 9p output dir
    assert "sh /pp-out/commands.sh > /pp-out/output.log" in DISK_INIT and "echo $? > /pp-out/rc" in DISK_INIT
    assert DISK_INIT.rstrip().splitlines()[-2] == "echo o > /proc/sysrq-trigger"
