"""The sidecar watcher: a small separate process that does not need the owner's GIL.

Why: a graph-learn client call against a dead server retries for minutes inside native code
*holding the GIL*; no Python thread of that process can run, so a thread watchdog cannot
fire. The sidecar watches the same pids through pidfds (it is not their parent, so it reads
the exit status from the zombie's ``/proc/<pid>/stat`` while the stuck owner has not reaped
it), logs the diagnosis through the owner's logging configuration (its file and stream
handlers, level and format as they were at ``arm()``), writes the torchelastic error file and then
stops the owner (SIGTERM, SIGKILL after a grace period) so the launcher tears the job down.

It judges deaths exactly as the owner's watcher thread does (:class:`healthkit._judge.Judge`
over :func:`healthkit._decide.decide`), from what it knows:

* a status it cannot read (the owner reaped the helper first, which is routine when the
  owner ``join()``s) is taken from the owner, whose watcher thread reports every status it
  learns; only when none comes is it "unknown", which fires for a process declared to run
  until disarmed and never for one allowed to finish;
* the owner's stop episode: the stop signals the owner's listener recorded (sent here before
  each byte is consumed), the stop signals the sidecar itself received (it is in the owner's
  process group: a group stop reaches both), a byte still unread on the owner's wakeup
  socket (the sidecar holds a copy of its read end and only ever *peeks*: the owner's GIL
  may be held, so nobody there can read it), and a stop signal still pending for the owner
  (``/proc/<owner>/status``);
* the processes :func:`healthkit.stop` in the owner set out to end (sent here before any
  signal), which are never reported.

Isolation: the sidecar runs as ``python -I``: neither the working directory, ``PYTHONPATH``
nor the user site can put code into it (it runs as the owner's user, often root). healthkit
itself is imported from the exact directory the owner imported it from, and attrs from the
owner's copy if the isolated path lacks it.

Signals: the sidecar survives SIGINT, SIGTERM and SIGHUP, and records when each came. It is in
the owner's process group, so a Ctrl-C or torchrun's group SIGTERM reaches it too: it must keep
watching while the owner cleans up, and its own record of the signal is evidence of the
owner's stop that no library in the owner (uvloop, a ``sigwait``, a signal storm) can take
away. It exits on ``disarm``, on end-of-file and when the owner is gone (its pidfd
is readable, it is a zombie, or SIGKILL is pending for it; end-of-file alone is not enough:
forked children of the owner inherit its end of the socket).

Protocol: every message and every other channel between the owner and this process is in
:mod:`healthkit._watchdog.protocol`. The owner's end is
:class:`healthkit._watchdog.sidecar_link.SidecarLink`.

Under a launcher's job, sidecar mode: the sidecar starts its own link to the job's store in a
*link process* of its own (:mod:`healthkit._watchdog.link_process`: importing torch there
does not stall the sidecar's loop).
"""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
import os
import signal
import socket
import sys
import time
from collections.abc import Callable

import attrs

from healthkit import _jobnotice
from healthkit._actions import (
    FailureEvent,
    emit,
    flush_logging,
    log_diagnosis,
    write_torchelastic_error_file,
)
from healthkit._decide import Decision, Verdict, check_on_clean_exit
from healthkit._diagnose.diagnosis import Diagnosis, ExitDiagnoser
from healthkit._errors import NoSuchProcessError
from healthkit._judge import Judge, Watched, early_exit_wording, survived_stop_wording
from healthkit._os.proc import ProcStat, group_members, read_pending_signals, read_proc_stat
from healthkit._progress import Tracker, stall_diagnosis
from healthkit._watch import stopsignals as _stopsignals
from healthkit._watch.process import UNKNOWN_NOT_PERMITTED, ExitStatus, ProcessWatch, WatchSet
from healthkit._watch.stop import stop, watch_tree
from healthkit._watch.stopsignals import STOP_SIGNALS, Signal, StopEpisode, current_episode
from healthkit._watchdog.link_process import LinkProcess, link_main
from healthkit._watchdog.logging_transfer import SIDECAR_FORMAT, RelayHandler, apply_logging_plan
from healthkit._watchdog.protocol import (
    NOTICE_FLUSH_S,
    OWNER_LOGGED_WAIT_S,
    OWNER_PUBLISH_WAIT_S,
    OWNER_STATUS_WAIT_S,
    Config,
    Disarm,
    Exiting,
    Expect,
    Flush,
    LineReader,
    Logged,
    Message,
    Notice,
    Progress,
    ProtocolError,
    Publish,
    Published,
    Ready,
    Status,
    Stop,
    Stopped,
    Survived,
    Watch,
    Watching,
    encode,
)

__all__ = ["main"]


logger = logging.getLogger("healthkit")


# A rank that exits with a code is often a consequence of another rank's failure (its
# collective saw the peer vanish): its witness waits this long for that notice first.
_EXIT_CODE_NOTICE_DELAY_S = 2.0

class _Sidecar:
    def __init__(self, sock: socket.socket, peek_fd: int | None) -> None:
        self.sock = sock
        self.peek = socket.socket(fileno=peek_fd) if peek_fd is not None else None
        self.reader = LineReader()
        self.done = False  # disarmed, end-of-file or owner gone
        self.records: dict[int, Watched] = {}  # id(record) -> record
        self.by_watch: dict[int, Watched] = {}  # id(watch) -> record
        self.by_pid: dict[int, Watched] = {}  # pid -> its latest record (the owner's word)
        self.seen: list[Watched] = []  # deaths seen, not yet judged
        self.stop_history: list[Signal] = []  # the owner's stop signals, as it reported them
        self.survived: list[float] = []  # when the owner said it carries on after a stop
        self.unread_since: float | None = None  # first peek of a stop byte the owner left unread
        self.pending_since: dict[signal.Signals, float] = {}  # first seen pending for the owner
        self.handling_since: dict[signal.Signals, float] = {}  # first seen being handled
        self.stopped: set[tuple[int, int | None]] = set()  # healthkit.stop() targets
        self.config: Config | None = None
        self.waits = WatchSet()
        self.diagnoser: ExitDiagnoser | None = None
        self.owner: ProcessWatch | None = None
        self.judge: Judge | None = None
        self.handlers: _stopsignals.HandlerWatch | None = None
        self.fired = False
        self.owner_logged = False  # the owner answered a flush of the relayed lines
        self.owner_publishing = False  # the owner was asked to publish a failure for us
        self.owner_published = False  # ...and answered
        self.owner_published_ok = False  # ...that the notice is in the store
        self.unpublished: _jobnotice.JobFailure | None = None  # left to the owner so far
        self.disarmed = False  # the owner said so: its end after that is not ours to tell
        self.owner_exiting = False  # its interpreter is shutting down (a witness stays)
        self.job: _jobnotice.JobScope | None = None
        self.notice: _jobnotice.JobFailure | None = None  # another rank's, to act on
        self.linkproc: LinkProcess | None = None  # sidecar mode under a launcher's job
        self.owner_stat: ProcStat | None = None
        self.relay: RelayHandler | None = None
        self.trackers: list[Tracker] = []

    @property
    def conf(self) -> Config:
        """The owner's configuration (the first message; set before anything else runs)."""
        assert self.config is not None
        return self.config

    # ---- messages
    def read_messages(self) -> list[Message] | None:
        """The messages that one read completes; None at end-of-file. A line that is no
        message is logged and skipped (the owner is the same healthkit: it is a bug)."""
        chunk = self.sock.recv(65536)
        if not chunk:
            return None
        out: list[Message] = []
        for msg in self.reader.feed(chunk):
            if isinstance(msg, ProtocolError):
                logger.error("healthkit sidecar: %s (ignored)", msg)
            else:
                out.append(msg)
        return out

    def read_pending_messages(self) -> None:
        """Take every message already sent, without waiting (before a judgement: a stop or
        a healthkit.stop() announced just before the death is then known)."""
        self.sock.setblocking(False)
        try:
            while not self.done:
                try:
                    msgs = self.read_messages()
                except (BlockingIOError, InterruptedError):
                    return
                if msgs is None:
                    self.done = True
                    return
                for msg in msgs:
                    self.on_message(msg)
        finally:
            self.sock.setblocking(True)

    def pump(self, until: Callable[[], bool], timeout: float) -> None:
        """Handle control messages until ``until()`` or timeout; deaths seen meanwhile wait
        in :attr:`seen`."""
        deadline = time.monotonic() + timeout
        while not until() and not self.done:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self.note_deaths(self.waits.wait(remaining))

    def note_deaths(self, ended: list[ProcessWatch]) -> None:
        for watch in ended:
            self.waits.remove(watch)  # level-triggered: seen once is enough
            if watch is self.owner:
                self.done = True  # the owner is gone: nothing left to protect
            else:
                self.seen.append(self.by_watch[id(watch)])

    def on_control(self) -> None:
        msgs = self.read_messages()
        if msgs is None:
            self.done = True  # the owner closed the link
        for msg in msgs or ():
            self.on_message(msg)
            if self.done:
                break
        self.waits.wake()  # a pump waits for what a message says

    def on_message(self, msg: Message) -> None:
        if isinstance(msg, Disarm):
            self.done = True
            self.disarmed = True
        elif isinstance(msg, Logged):
            self.owner_logged = True
            if self.relay is not None:
                self.relay.confirmed(msg.n)
        elif isinstance(msg, Published):
            self.owner_published = True
            self.owner_published_ok = msg.ok
        elif isinstance(msg, Notice):  # another rank's, heard first by the owner's link
            try:
                failure = _jobnotice.JobFailure.from_bytes(msg.notice.encode())
            except (KeyError, ValueError):
                logger.warning("a malformed notice from the owner was ignored")
            else:
                self.follow(failure)
        elif isinstance(msg, Exiting):
            self.owner_exiting = True  # its exit code is still ours to tell
        elif isinstance(msg, Stop):
            self.stop_history.append((signal.Signals(msg.signal), msg.at, "delivered"))
        elif isinstance(msg, Survived):
            at = msg.at
            self.survived.append(at)
            if self.judge is not None:  # what that stop deferred is decided again now
                self.judge.resume(list(self.records.values()), at)
            for tracker in self.trackers:
                if tracker.due is not None:
                    tracker.due = min(tracker.due, at)
        elif isinstance(msg, Stopped):
            self.stopped.add((msg.pid, msg.start_time))
        elif isinstance(msg, Status):
            told = self.by_pid.get(msg.pid)
            if told is not None:  # the owner watches only what it told us to watch
                told.told = ExitStatus(msg.returncode, msg.source)
        elif isinstance(msg, Expect):
            pass  # on_control wakes the loop, which looks at the untimed pages
        elif isinstance(msg, Progress):
            self.open_progress(msg)
            self.sock.sendall(encode(Watching()))
        elif isinstance(msg, Watch):
            record = self.open(msg)
            self.sock.sendall(encode(Watching()))
            if record.watch is None:
                self.seen.append(record)

    def open(self, msg: Watch) -> Watched:
        record = Watched(
            pid=msg.pid,
            name=msg.name,
            on_clean_exit=check_on_clean_exit(msg.on_clean_exit),
            pgrp=msg.pgrp,
            start_time=msg.start_time,
        )
        self.records[id(record)] = record
        self.by_pid[record.pid] = record
        if msg.ended:
            record.told = ExitStatus(msg.returncode, "owner")
            return record
        try:
            watch = ProcessWatch(record.pid, name=record.name)
        except NoSuchProcessError:
            return record  # gone already: the owner will say how
        stat = read_proc_stat(record.pid)
        if record.start_time is not None and (stat is None or stat.start_time != record.start_time):
            watch.close()  # the pid now names another process: ours died already
            return record
        record.watch = watch
        self.by_watch[id(watch)] = record
        self.waits.add(watch)
        return record

    def open_progress(self, msg: Progress) -> None:
        assert self.owner is not None
        path = f"/proc/{self.owner.pid}/fd/{int(msg.fd)}"
        try:
            bell = msg.bell
            tracker = Tracker.open(
                path,
                float(msg.stall_timeout),
                msg.name,
                msg.who,
                bell=None if bell is None else f"/proc/{self.owner.pid}/fd/{int(bell)}",
            )
        except (OSError, ValueError) as e:
            logger.error(
                "%s: cannot map the progress page of %s (%s: %s): its stalls are not watched",
                self.conf.name, msg.name, path, e,
            )
            return
        self.trackers.append(tracker)
        if tracker.bell is not None:

            def rung() -> None:  # a call began while no timer was set: look
                tracker.drain()
                self.waits.wake()

            self.waits.add_fd(tracker.bell, rung)

    def look_progress(self) -> None:
        """Look at each progress page that is due or not timed yet."""
        now = time.monotonic()
        for tracker in self.trackers:
            if self.done:
                return
            if tracker.due is not None and tracker.due > now:
                continue
            decision, quiet = tracker.look(
                now,
                armed=not self.done,
                stop=self.episode,
                stop_grace=self.conf.stop_grace,
            )
            if decision.verdict is Verdict.FIRE and quiet is not None and not self.fired:
                tracker.fired = True
                stalled = stall_diagnosis(tracker, quiet)
                self.tell_job(stalled)
                self.act(stalled)
            elif decision.verdict is Verdict.DEFER:
                logger.warning("%s stalled; %s", tracker.name, decision.reason)

    # ---- what the sidecar knows of its owner
    def episode(self, now: float) -> StopEpisode | None:
        """The owner's stop episode at ``now``: a stop signal still pending for it, one whose
        handler is running in it, a stop byte it has not read yet (its GIL may be held), and
        what it reported. Looked at in the order a signal lives (queued, taken, delivered,
        read and reported before its byte is consumed), so a signal that moves on between two
        looks is caught by the next."""
        assert self.owner is not None
        history: list[Signal] = []
        pending = _stopsignals.pending_stop(self.owner.pid)
        handled = None
        if pending is None and self.handlers is not None:
            handled = self.handlers.handling()
        # Dated from when each was first seen: a signal left pending (blocked), or a mask
        # that stays, is one stop with one start, not a new stop at every look.
        for since, seen_now in ((self.pending_since, pending), (self.handling_since, handled)):
            for gone in [s for s in since if s != seen_now]:
                del since[gone]
        if pending is not None:
            history.append((pending, self.pending_since.setdefault(pending, now), "pending"))
        if self.peek is not None:
            try:
                unread = self.peek.recv(4096, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                unread = b""
            except OSError:
                unread = b""
            stops = [b for b in unread if b in STOP_SIGNALS]
            if stops:
                if self.unread_since is None:
                    self.unread_since = now
                history.append((signal.Signals(stops[0]), self.unread_since, "delivered"))
            else:
                self.unread_since = None
        self.read_pending_messages()
        history.extend(self.stop_history)
        # Taken off the sidecar's own pending set when it returned from the wait that saw the
        # death; its handler has run since (at the first bytecode boundary).
        history.extend((sig, at, "witnessed") for sig, at in _group_stops)
        if handled is not None:
            began = self.handling_since.setdefault(handled, now)
            if _stopsignals.mask_not_stop(began, now, history):
                # Blocked for good with no stop signal anywhere: a mask, not a stop.
                del self.handling_since[handled]
                if self.handlers is not None:
                    self.handlers.accept()
            else:
                history.append((handled, began, "handling"))
        return current_episode(history, now, self.conf.stop_grace, self.survived)

    def owner_gone(self) -> bool:
        """Whether the owner is dead or dying: its pidfd is readable only once all its
        threads are gone, but a helper that dies *with* it (a parent-death signal, or the
        SIGKILL torchrun sends to the whole group) can be seen before that."""
        assert self.owner is not None
        if self.owner.poll() is not None:
            return True
        stat = read_proc_stat(self.owner.pid)
        if stat is None or stat.state in ("Z", "X"):
            return True
        pending = read_pending_signals(self.owner.pid)
        return pending is not None and signal.SIGKILL in pending

    # ---- judging
    def status_of(self, record: Watched) -> ExitStatus:
        """How ``record``'s process ended: read from its zombie if this process can, else
        the owner's word (kept in :attr:`Watched.told`; :attr:`Watched.status` weighs the
        two)."""
        if record.watch is not None:
            record.watch.poll()
            self.waits.remove(record.watch)
        status = record.status
        if status is None or (status.returncode is None and status.source != UNKNOWN_NOT_PERMITTED):
            # The owner reaped it before we could read the zombie: its watcher thread
            # tells us what it learned (unless its GIL is held, and then it cannot reap).
            self.pump(lambda: record.told is not None, OWNER_STATUS_WAIT_S)
            status = record.status
            if status is None:
                record.told = ExitStatus(None, "unknown: gone before the sidecar could read it")
                status = record.told
        return status

    def on_death(self, record: Watched) -> None:
        status = self.status_of(record)
        if self.done:
            return
        self.read_pending_messages()  # a healthkit.stop() announced before it signalled
        assert self.judge is not None
        self.judge.judge(record, status, owner_gone=self.owner_gone())
        if self.owner_gone():
            self.done = True

    def describe(self, record: Watched, status: ExitStatus) -> Diagnosis:
        assert self.diagnoser is not None
        subject: ProcessWatch | ExitStatus = (
            record.watch if record.watch is not None and record.watch.status is status else status
        )
        # The start time names the process for good: its exception record and its kernel-log
        # OOM record are found even when the owner reaped it before the sidecar read it.
        diagnosis = self.diagnoser.diagnose(
            subject, name=record.name, pid=record.pid, start_time=record.start_time
        )
        return early_exit_wording(diagnosis, record, self.diagnoser)

    def fire(self, record: Watched, status: ExitStatus, excused: Decision | None) -> None:
        if self.fired:
            return
        diagnosis = self.describe(record, status)
        if excused is not None:
            diagnosis = survived_stop_wording(diagnosis, excused)
        self.tell_job(diagnosis)
        self.act(diagnosis)

    def tell_job(self, diagnosis: Diagnosis) -> None:
        """Publish the owner's failure to the job (a no-op outside a launcher's job)."""
        if self.job is None:
            return
        failure = _jobnotice.JobFailure.of(
            diagnosis, self.job, origin_pid=self.conf.owner_pid)
        if self.linkproc is not None and not self.linkproc.ready:
            # This link is still coming up (torch is being imported: seconds on a loaded
            # machine). The owner's is up: it publishes first, and act() waits (bounded) for
            # its answer before stopping it; this one publishes only if the owner could not.
            with contextlib.suppress(OSError):
                self.sock.sendall(encode(Publish(notice=failure.to_bytes().decode())))
                self.owner_publishing = True
                self.unpublished = failure
                return
        self.publish(failure)

    def publish(self, failure: _jobnotice.JobFailure) -> None:
        if self.linkproc is not None:
            self.linkproc.publish(failure)
        else:
            _jobnotice.publish(failure)

    def on_link(self) -> None:
        """Lines from the link process: it is up, or another rank's notice."""
        assert self.linkproc is not None
        msgs = self.linkproc.read()
        if msgs is None:
            self.waits.remove_fd(self.linkproc.fileno())
            return
        for msg in msgs:
            if isinstance(msg, Ready):
                self.linkproc.ready = True
            elif isinstance(msg, Notice):
                try:
                    failure = _jobnotice.JobFailure.from_bytes(msg.notice.encode())
                except (KeyError, ValueError):
                    continue
                self.follow(failure)

    def act(self, diagnosis: Diagnosis) -> None:
        """Log, write the error file, then stop the owner and its helpers."""
        self.fired = True
        config = self.conf
        event = FailureEvent(diagnosis, config.name + " (sidecar)", config.owner_pid)
        for action in (log_diagnosis(), write_torchelastic_error_file()):
            try:
                action(event)
            except Exception:
                logger.exception("action %r failed", action)
        emit(
            logger,
            logging.ERROR,
            f"stopping the owner (pid {config.owner_pid}) so the launcher tears the job down",
        )
        flush_logging(logger)
        if self.relay is not None:
            # The owner writes these lines to its other handlers if it still can.
            self.owner_logged = False
            with contextlib.suppress(OSError):
                self.sock.sendall(encode(Flush(n=self.relay.sent)))
            self.pump(lambda: self.owner_logged and not self.relay_pending(),
                      OWNER_LOGGED_WAIT_S)
            self.relay.write_unconfirmed()
        if self.owner_publishing:
            self.pump(lambda: self.owner_published, OWNER_PUBLISH_WAIT_S)
        if self.unpublished is not None and not self.owner_published_ok:
            # The owner could not (its GIL held, its link down): this link publishes once
            # up (this process waits for it before it ends).
            self.publish(self.unpublished)
        self.unpublished = None
        assert self.owner is not None
        # The owner's whole helper tree (DataLoader workers, its own helpers' children),
        # listed while the owner lives: once it dies they are reparented out of reach.
        tree = watch_tree(self.owner.pid, exclude=self.ours())
        # SIGTERM, then SIGKILL after the grace: a Python SIGTERM handler cannot run while
        # the owner's GIL is held. The owner and its helpers at once, on one deadline: one
        # after the other, the helpers outlived the owner by its whole exit.
        grace = config.kill_after
        stop([self.owner, *tree], kill_after=grace, name="the owner and its helpers")
        for watch in tree:
            watch.close()
        # The owner had no chance to stop its helpers (its atexit hooks did not run):
        # stop the other processes it asked us to watch, as its normal exit would have.
        for other in self.records.values():
            if other.watch is not None:
                other.watch.terminate()
        self.done = True

    # ---- the job-wide notice
    def follow(self, failure: _jobnotice.JobFailure) -> None:
        """Another rank failed first (told by the link process or by the owner): tell it in
        the owner's log and error file, then stop the owner as for a failure of our own."""
        if failure.origin_pid == self.conf.owner_pid:
            return
        self.notice = failure
        self.waits.wake()  # the main loop acts: one thread judges and acts

    def witness_owner_end(self) -> None:
        """The owner itself ended while armed: if that was a failure (a kill that no stop
        explains, a crash, an exit code with no error file written), write the rank's
        torchelastic error file with its diagnosis, then tell the job. A stop (SIGTERM,
        SIGINT, SIGHUP, or any end while a stop signal is under way) is never told."""
        assert self.owner is not None and self.diagnoser is not None
        status = self.owner.wait(10.0 if self.owner_exiting else 1.0)
        if status is None or status.returncode is None or status.returncode == 0:
            return  # still running, or an end we cannot read: nothing to say
        self.read_pending_messages()
        if self.disarmed:
            return
        now = time.monotonic()
        code = status.returncode
        if code < 0:
            sig = signal.Signals(-code)
            if sig in STOP_SIGNALS:
                return
            if sig is signal.SIGKILL and self.episode(now) is not None:
                return  # the launcher's SIGKILL after its stop's grace
        else:
            if self.episode(now) is not None:
                return
            path = self.conf.error_file
            if path and os.path.exists(path):
                return  # the rank wrote its own story (@record, a watchdog, a notice)
        name = self.rank_name()
        diagnosis = self.diagnoser.diagnose(
            self.owner, name=name, pid=self.owner.pid,
            start_time=(self.owner_stat.start_time if self.owner_stat else None),
        )
        if code > 0:  # a rank, not a helper: its traceback is in its log, and @record
            diagnosis = attrs.evolve(diagnosis, hint=(
                "Its traceback, if it raised, is in its log (stderr); decorate the rank's "
                "entry point with torch.distributed.elastic.multiprocessing.errors.record to "
                "have torchrun show it here"))
        event = FailureEvent(diagnosis, self.conf.name + " (witness)", self.owner.pid)
        write_torchelastic_error_file(self.conf.error_file)(event)
        log_diagnosis()(event)
        flush_logging(logger)
        self.stop_orphans()
        if self.job is None:
            return
        if code > 0:
            # An exit code is often the consequence of another rank's failure (a collective
            # that saw the peer vanish): let the cause's notice arrive first.
            _jobnotice.start(self.job)
            time.sleep(_EXIT_CODE_NOTICE_DELAY_S)
        else:
            _jobnotice.start(self.job)
        _jobnotice.publish(_jobnotice.JobFailure.of(diagnosis, self.job,
                                                    origin_pid=self.owner.pid))

    def stop_orphans(self) -> None:
        """Stop what the dead owner left in its own process group (its helpers, now
        reparented): a launcher signals the group of a rank it stops, but not of a rank that
        died by itself, so a daemon helper of an OOM-killed rank would outlive the job.
        Only when the owner led its group (torchrun starts each rank in a session of its
        own): a group it merely joined may hold processes that are not its."""
        assert self.owner is not None
        stat = self.owner_stat
        if stat is None or stat.pgrp != self.owner.pid:
            return
        watches: list[ProcessWatch] = []
        for pid in group_members(stat.pgrp):
            if pid in self.ours():
                continue
            listed = read_proc_stat(pid)
            try:
                watch = ProcessWatch(pid, name=f"pid {pid}")
            except NoSuchProcessError:
                continue
            again = read_proc_stat(pid)
            if listed is None or again is None or again.start_time != listed.start_time:
                watch.close()  # the pid was reused between the listing and the pidfd
                continue
            watches.append(watch)
        if watches:
            stop(watches, kill_after=self.conf.kill_after,
                 name="the dead rank's helpers")
            for watch in watches:
                watch.close()

    def ours(self) -> list[int]:
        """This process and its link process: in the owner's tree and group, never stopped
        with it (they end by themselves once the owner is gone)."""
        return [os.getpid()] + ([self.linkproc.proc.pid] if self.linkproc is not None else [])

    def rank_name(self) -> str:
        job = self.job
        if job is not None and job.rank is not None:
            return f"rank {job.rank}"
        return "the owner"

    def relay_pending(self) -> bool:
        return self.relay is not None and bool(self.relay.unconfirmed)

    # ---- main loop
    def run(self) -> int:
        try:
            return self._run()
        finally:
            if self.relay is not None:
                self.relay.write_unconfirmed()  # the owner is gone or let us go

    def _run(self) -> int:
        while self.config is None:
            msgs = self.read_messages()
            if msgs is None:
                return 0
            if msgs:
                if not isinstance(msgs[0], Config):
                    logger.error("healthkit sidecar: expected the owner's config, got %r", msgs[0])
                    return 1
                self.config = msgs[0]
        config = self.config
        fallback = apply_logging_plan(config.logging)
        if (config.logging or {}).get("relay"):
            self.relay = RelayHandler(self.sock, fallback)
            logging.getLogger("healthkit").addHandler(self.relay)
        try:
            self.owner = ProcessWatch(config.owner_pid, name="owner")
        except NoSuchProcessError:
            return 0
        self.owner_stat = read_proc_stat(self.owner.pid)
        self.handlers = _stopsignals.HandlerWatch(self.owner.pid)
        self.handlers.learn()  # the owner waits in arm() for "ready": no handler is running
        # The owner's diagnoser, built again here: its cgroup, kernel log, record
        # directory and the OOM counter's baseline ("during this run" is the owner's run).
        settings = config.diagnoser
        self.diagnoser = (
            ExitDiagnoser._from_settings(settings) if settings else ExitDiagnoser()
        )
        interval = config.rss_sample_interval
        self.judge = Judge(
            name=config.name + " (sidecar)",
            log=logger,
            stop_grace=self.conf.stop_grace,
            owner_pgrp=config.owner_pgrp,
            episode=self.episode,
            stopped_by_healthkit=lambda r: (r.pid, r.start_time) in self.stopped,
            describe=self.describe,
            fire=self.fire,
            armed=lambda: not self.done,
            second_look=config.second_look,
            may_be_taking_stop=lambda: self.handlers is None or self.handlers.running(),
        )
        self.waits.add_fd(self.sock.fileno(), self.on_control)
        self.waits.add(self.owner)
        job = config.job
        if job is not None:
            self.job = _jobnotice.JobScope.from_dict(job)
            if not config.witness:
                # Sidecar mode: this process publishes the owner's failures and acts on the
                # other ranks' (the owner's GIL may be held). A witness starts its link only
                # if the owner dies (torch is imported then, not for every healthy rank).
                self.linkproc = LinkProcess(self.job)
                self.waits.add_fd(self.linkproc.fileno(), self.on_link)
        self.sock.sendall(encode(Ready()))
        next_sample = time.monotonic() + interval if interval else None
        with self.waits:
            while True:
                while self.seen and not self.done:
                    self.on_death(self.seen.pop(0))
                if self.notice is not None and not self.done and not self.fired:
                    self.act(self.notice.diagnosis())
                if self.done:
                    # The owner's own end is told under a launcher's job only (its error
                    # file, the other ranks); elsewhere whoever started it sees it.
                    if not self.disarmed and not self.fired and self.job is not None:
                        self.witness_owner_end()
                    _jobnotice.flush(NOTICE_FLUSH_S)  # this process outlives the owner
                    if self.linkproc is not None:
                        self.linkproc.finish(NOTICE_FLUSH_S + 5.0)
                    return 0
                due = Judge.next_due(list(self.records.values()))
                dues = [t.due for t in self.trackers if t.due is not None]
                dues += [t for t in (due, next_sample) if t is not None]
                timeout = max(0.0, min(dues) - time.monotonic()) if dues else None
                self.note_deaths(self.waits.wait(timeout))
                if next_sample is not None and time.monotonic() >= next_sample:
                    # Peak RSS while alive, as the owner's thread samples it: the line of
                    # a helper that died of memory then says how much it held.
                    for record in self.records.values():
                        if record.watch is not None and record.watch.status is None:
                            record.watch.sample_rss()
                    next_sample = time.monotonic() + (interval or 0.0)
                if self.trackers and not self.seen and not self.done:
                    self.look_progress()
                    if self.done:
                        continue  # it fired: the top of the loop ends it
                if due is not None and time.monotonic() >= due and not self.done:
                    self.read_pending_messages()
                    self.judge.expire(list(self.records.values()), owner_gone=self.owner_gone())
                    if self.owner_gone():
                        self.done = True


#: The stop signals this sidecar received, with when (``CLOCK_MONOTONIC``): it is in the
#: owner's process group, so a group stop reaches it as it reaches the owner.
_group_stops: list[tuple[signal.Signals, float]] = []


def _witness(signum: int, frame: object) -> None:
    _group_stops.append((signal.Signals(signum), time.monotonic()))


def main(argv: list[str]) -> int:
    if argv and argv[0] == "link":
        return link_main(argv[1:])
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        # Group stops are for the owner to handle; the sidecar keeps watching, and keeps the
        # time as the owner's stop evidence that nothing in the owner can take away.
        signal.signal(sig, _witness)
    # Inherited from the thread that started it (an owner that sigwait()s blocks them).
    signal.pthread_sigmask(signal.SIG_UNBLOCK, list(STOP_SIGNALS))
    # Until the owner's configuration arrives (apply_logging_plan), its own line on stderr.
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format=SIDECAR_FORMAT)
    sock = socket.socket(fileno=int(argv[0]))
    peek_fd = int(argv[1])
    return _Sidecar(sock, peek_fd if peek_fd >= 0 else None).run()

