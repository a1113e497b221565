"""A warm-list module that says who imported it: each import appends its pid to ``$JM_WARM_IMPORT_LOG``,
then waits while the file named by ``$JM_SLOW_IMPORT_FLAG`` exists (at most 60 s). If the file named by
``$JM_STOP_AT_FORK_FLAG`` exists, the first process forked after the import removes it and stops itself
(SIGSTOP) before it returns from the fork: in the seed, a warm child stopped before its hello."""

import os
import signal
import time

_log = os.environ.get("JM_WARM_IMPORT_LOG", "")
if _log:
    with open(_log, "a") as f:
        f.write(f"{os.getpid()}\n")
_flag = os.environ.get("JM_SLOW_IMPORT_FLAG", "")
_deadline = time.monotonic() + 60
while _flag and os.path.exists(_flag) and time.monotonic() < _deadline:
    time.sleep(0.05)


def _stop_once() -> None:
    try:
        os.unlink(_stop_flag)
    except OSError:
        return  # not asked, or another child took it
    os.kill(os.getpid(), signal.SIGSTOP)


_stop_flag = os.environ.get("JM_STOP_AT_FORK_FLAG", "")
if _stop_flag:
    os.register_at_fork(after_in_child=_stop_once)
