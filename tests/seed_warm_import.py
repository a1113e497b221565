"""A warm-list module that says who imported it: each import appends its pid to ``$JM_WARM_IMPORT_LOG``,
then waits while the file named by ``$JM_SLOW_IMPORT_FLAG`` exists (at most 60 s)."""

import os
import time

_log = os.environ.get("JM_WARM_IMPORT_LOG", "")
if _log:
    with open(_log, "a") as f:
        f.write(f"{os.getpid()}\n")
_flag = os.environ.get("JM_SLOW_IMPORT_FLAG", "")
_deadline = time.monotonic() + 60
while _flag and os.path.exists(_flag) and time.monotonic() < _deadline:
    time.sleep(0.05)
