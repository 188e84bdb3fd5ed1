"""--wal-device-limit parsing (agent.host.io_limit): what the throttle is asked for, and one clear line otherwise."""
import pytest
from pathprof.agent.host.io_limit import describe, parse_limits
from pathprof.errors import UserError


def test_limits_with_units():
    assert parse_limits("wiops=200") == {"wiops": 200}
    assert parse_limits("wiops=200, wbps=4M,rbps=512k") == {"wiops": 200, "wbps": 4 << 20, "rbps": 512 << 10}
    assert describe({"wiops": 200, "wbps": 1024}) == "wiops=200,wbps=1024"


@pytest.mark.parametrize("text, words", [("wiops", "is not one of"), ("latency=5", "is not one of"),
                                         ("wiops=2k", "whole number"), ("wbps=fast", "whole number"),
                                         ("riops=0", "at least 1"), ("", "is not one of")])
def test_bad_limits(text, words):
    with pytest.raises(UserError, match=words):
        parse_limits(text)
