"""The owner-sidecar protocol: every message type survives a round trip through its one
encoder and decoder, a bad line is refused with a typed error, and the module's table (and
docs/architecture.md) names every message and channel. The real exchange is exercised by the
sidecar tests (tests/core/test_watchdog.py and others)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import healthkit
from healthkit._watchdog import protocol as p

ROOT = Path(__file__).resolve().parents[2]

#: One example per message type, with every field set to a value unlike its default.
EXAMPLES: dict[str, p.Message] = {
    m.op: m
    for m in (
        p.Config(
            owner_pid=4321, owner_pgrp=4300, name="gl server watchdog", kill_after=2.5,
            stop_grace=35.0, second_look=0.05,
            logging={"level": 20, "disabled": False, "handlers": [{"fd": 2}], "relay": True},
            witness=True, job={"run_id": "r1", "rank": 3}, error_file="/tmp/err.json",
            diagnoser={"cgroup": None}, rss_sample_interval=0.5,
        ),
        p.Ready(),
        p.Watch(pid=77, name="sampler", start_time=123456, on_clean_exit="warn", pgrp=70,
                ended=True, returncode=-9),
        p.Watching(),
        p.Status(pid=77, returncode=None, source="unknown: reaped elsewhere"),
        p.Stop(signal=15, at=1234.5),
        p.Survived(at=1240.25),
        p.Stopped(pid=78, start_time=None),
        p.Progress(fd=9, bell=10, name="epoch", who="worker 0", stall_timeout=60.0),
        p.Expect(),
        p.Notice(notice='{"rank": 1, "line": "rank 1: killed"}'),
        p.Exiting(),
        p.Disarm(),
        p.Log(level=40, msg="sampler (pid 77) was killed by SIGKILL", created=1.7e9),
        p.Flush(n=3),
        p.Logged(n=3),
        p.Publish(notice='{"rank": 0}'),
        p.Published(ok=True),
    )
}  # fmt: skip


def test_every_message_type_has_an_example_here() -> None:
    assert set(EXAMPLES) == set(p.MESSAGES)


@pytest.mark.parametrize("op", sorted(p.MESSAGES))
def test_each_message_survives_a_round_trip(op: str) -> None:
    message = EXAMPLES[op]
    line = p.encode(message)
    assert line.endswith(b"\n") and line.count(b"\n") == 1  # one line, whatever the text
    assert json.loads(line)["op"] == op
    assert p.decode(line.rstrip(b"\n")) == message


def test_a_reader_splits_a_stream_cut_anywhere_into_the_same_messages() -> None:
    stream = b"".join(p.encode(m) for m in EXAMPLES.values())
    for cut in (1, 7, 64, len(stream) - 1):
        reader = p.LineReader()
        got = reader.feed(stream[:cut]) + reader.feed(stream[cut:])
        assert got == list(EXAMPLES.values())
        assert not reader.has_line()


@pytest.mark.parametrize(
    "line",
    [
        b"not json",
        b"[1, 2]",
        b'{"op": "no such message"}',
        b'{"pid": 3}',
        b'{"op": "stop", "signal": 15}',  # a field missing
        b'{"op": "stop", "signal": 15, "at": 1.0, "extra": 2}',  # a field unknown
    ],
)
def test_a_bad_line_is_refused_with_a_typed_error_and_the_next_line_still_read(
    line: bytes,
) -> None:
    with pytest.raises(p.ProtocolError) as caught:
        p.decode(line)
    assert isinstance(caught.value, (healthkit.HealthkitError, ValueError))
    reader = p.LineReader()
    bad, good = reader.feed(line + b"\n" + p.encode(p.Ready()))
    assert isinstance(bad, p.ProtocolError) and good == p.Ready()


def test_the_tables_name_every_message_and_every_channel() -> None:
    doc = p.__doc__ or ""
    for cls in p.MESSAGES.values():
        assert f":class:`{cls.__name__}`" in doc, cls.__name__
    architecture = (ROOT / "docs" / "architecture.md").read_text()
    for channel in ("argv and ``pass_fds``", "JSON lines", "raw signal bytes", "``/proc``"):
        assert channel in doc, channel
        assert channel.replace("``", "`") in architecture, channel
    for op in p.MESSAGES:
        assert f"`{op}`" in architecture, op


def test_the_command_starts_the_sidecar_module_of_this_very_package() -> None:
    cmd = p.sidecar_command(5, None)
    assert cmd[1:3] == ["-I", "-c"] and cmd[-2:] == ["5", "-1"]
    assert Path(cmd[4]) == Path(healthkit.__file__).parent
    module = "healthkit._watchdog.sidecar_process"
    assert f"from {module} import main" in cmd[3]
    assert (Path(cmd[4]) / "_watchdog" / "sidecar_process.py").is_file()
    link = p.link_command(6, {"run_id": "r"})
    assert link[6:8] == ["link", "6"] and json.loads(link[8]) == {"run_id": "r"}

