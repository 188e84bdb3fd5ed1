"""A Ctrl-C inside a deferred zone (pyroute2's event loop) is raised at the zone's end, not inside it; outside one
it raises at once, as before. Real signals to this process, through the run's own handler."""
import os
import signal

import pytest
from pathprof.agent.host.signal_zone import deferred_signals
from pathprof.agent.run.signals import interrupted, sigterm_as_interrupt


def test_a_signal_inside_the_zone_waits_for_its_end():
    reached = []
    with sigterm_as_interrupt():
        with pytest.raises(KeyboardInterrupt):
            with deferred_signals():
                with deferred_signals():                 # nested: only the outermost end raises
                    os.kill(os.getpid(), signal.SIGINT)
                    reached.append("inner")
                reached.append("outer")
        assert interrupted()
    assert reached == ["inner", "outer"]


def test_outside_the_zone_it_raises_at_once():
    reached = []
    with sigterm_as_interrupt():
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            reached.append("after")
    assert reached == []
    with deferred_signals():                              # nothing pending: the zone ends quietly
        pass
