"""The diagnosis layer: why a process ended. :mod:`.diagnosis` holds ExitDiagnoser (exit code
or signal, OOM kill, the cause in words); :mod:`.evidence` reads the kernel log and cgroup
counters behind an OOM verdict; :mod:`.records` carries a helper's own exception
(``record_exception``); :mod:`.stacks` dumps a live process's Python stacks without
interrupting it. Built on :mod:`healthkit._os` and :mod:`healthkit._watch`."""
