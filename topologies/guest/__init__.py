"""The kvm-tap guest: a cached Debian 12 + PostgreSQL 15 disk image (image.py) and the qemu VM that boots it (vm.py)."""
from pathprof.topologies.guest.image import GuestImage, Recipe
from pathprof.topologies.guest.vm import GuestVM

__all__ = ["GuestImage", "GuestVM", "Recipe"]
