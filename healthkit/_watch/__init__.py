"""The watch layer: noticing that a process ended, and knowing whether this process is being
stopped. :mod:`.process` holds ProcessWatch and WatchSet (one pidfd per process, one epoll);
:mod:`.stopsignals` records this process's stop signals (the wakeup-fd replacement, the
witness); :mod:`.stop` is ``healthkit.stop()``, the one way to end processes, and remembers
what it set out to end; :mod:`.lease` watches a peer on another machine through one TCP
connection (``lowlevel.LeaseServer``, ``Lease``). Built on :mod:`healthkit._os` only."""
