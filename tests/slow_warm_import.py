"""A module whose import waits while the file named by ``$JM_SLOW_IMPORT_FLAG`` exists (at most 60 s):
a template preloading it stays busy, as one importing torch on a slow day, for as long as a test needs."""

import os
import time

_flag = os.environ.get("JM_SLOW_IMPORT_FLAG", "")
_deadline = time.monotonic() + 60
while _flag and os.path.exists(_flag) and time.monotonic() < _deadline:
    time.sleep(0.05)
