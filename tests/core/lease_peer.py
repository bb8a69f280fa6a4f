"""A peer for tests/core/test_lease.py, run as its own process: a LeaseServer of its own and
a lease on the test's server (``argv``: its port and server id). Prints one JSON line with
its server's port and id and its lease's token, then obeys stdin, one command a line:
``close`` (close its lease, say so), ``exit`` (return from main: a clean exit, the
interpreter closes the sockets). End-of-file on stdin (the test is gone) is an exit too.
Its own server's lease ends are printed as ``{"ended": token, "why": ...}``."""

from __future__ import annotations

import json
import sys

from healthkit.lowlevel import Lease, LeaseServer

CONNECTION_TIMEOUT_S = 2.0


def _say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def main(port: int, server_id: str) -> int:
    server = LeaseServer(
        lambda token, why: _say(ended=token, why=why),
        connection_timeout=CONNECTION_TIMEOUT_S,
        bind_host="127.0.0.1",
    )
    lease = Lease.open([("127.0.0.1", port)], server_id, connection_timeout=CONNECTION_TIMEOUT_S)
    _say(port=server.port, server_id=server.server_id, token=lease.token)
    for line in sys.stdin:
        if line.strip() == "close":
            lease.close()
            _say(closed=True)
        elif line.strip() == "exit":
            break
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), sys.argv[2]))
