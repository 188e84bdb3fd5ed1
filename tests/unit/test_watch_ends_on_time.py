"""attach's interval (agent.run.observed.watch) ends on time: hosts' agents given one --start-at and one duration
end together only if none of them does its once-a-second work (a look at the sockets, a read of the maps) past the
end. Beside another load a look took ~0.5 s: 10-16 % of a 4-s interval recorded by one agent and not the others."""
import time

from pathprof.agent.run.observed import watch


class NoProbes:
    def frames(self, asleep_ns=None):
        return []


class Quiet:
    def phase(self, text):
        pass


def test_no_look_after_the_end_and_the_end_on_time():
    looks = []

    def slow_look():
        looks.append(time.monotonic())
        time.sleep(0.4)

    t0 = time.monotonic()
    watch(NoProbes(), path=None, duration_s=1.5, ui=Quiet(), feed=lambda *a: None, tick=slow_look)
    took = time.monotonic() - t0
    assert took < 1.5 + 0.25, f"the interval ended {took - 1.5:.2f} s late"
    assert looks and all(t - t0 < 1.5 for t in looks), [round(t - t0, 2) for t in looks]
