"""The harness's own alarm filter: a Ctrl-C's traceback from a process that was starting up is
not a healthkit alarm, and one raised through healthkit code still is."""

from __future__ import annotations

import pytest
from gl_procs import alarms

STARTUP = """\
Traceback (most recent call last):
  File "<frozen site>", line 186, in addpackage
  File "/v/lib/python3.11/site-packages/__editable___pipeline_healthkit_0_1_0_finder.py", line 7
    from pathlib import Path
  File "<frozen importlib._bootstrap>", line 1176, in _find_and_load
KeyboardInterrupt"""

THROUGH_HEALTHKIT = """\
Traceback (most recent call last):
  File "/w/integrations/graphlearn/healthkit_graphlearn/_server.py", line 12, in wait
    time.sleep(1)
KeyboardInterrupt"""


@pytest.mark.timeout(10)
def test_a_start_up_interrupt_is_not_an_alarm_and_one_through_healthkit_code_is() -> None:
    assert alarms(STARTUP) == []
    assert alarms("INFO healthkit.graphlearn: server up\n" + STARTUP + "\nrank 0 done") == []
    kept = alarms(THROUGH_HEALTHKIT)
    assert kept and "healthkit_graphlearn/_server.py" in kept[0], kept
    # a start-up traceback of another exception is kept, and so is a healthkit line after it
    other = STARTUP.replace("KeyboardInterrupt", "ImportError: no module named x")
    assert alarms(other), alarms(other)
    assert alarms(STARTUP + "\nERROR healthkit: the sampler server died") == [
        "ERROR healthkit: the sampler server died"
    ]
