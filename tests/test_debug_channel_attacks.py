"""Bad input to the sidebar's debugger requests and the long-call view's timer (issue 15 attacks).

- ``jupyter_mesh_debug_request`` with content that is not an object, or fields of the wrong type, or a
  huge pdb command, answers ``status: error`` saying what was wrong, on the kernel's control channel
  (before: a list raised ``AttributeError`` in the control handler, a traceback and no reply).
- A huge ``slow_call_after`` (or inf) does not kill the long-call view's timer thread (before: the
  lock's timeout overflowed, the thread died with a traceback and no view showed again in that kernel).
"""

from __future__ import annotations

import threading
import time

import pytest
from _kernel import fresh_kernel

from jupyter_mesh.ui.debug_channel import MAX_LINE, handle


@pytest.mark.parametrize(
    "req, said",
    [
        (["op", "attach"], "a debugger request is a JSON object, not list"),
        ("attach", "a debugger request is a JSON object, not str"),
        ({"op": "attach", "mesh_id": "m", "rank": [1]}, "'rank' must be int, not list"),
        ({"op": "attach", "mesh_id": "m", "rank": True}, "'rank' must be int, not bool"),
        ({"op": "send", "mesh_id": "m", "rank": 1.5}, "'rank' must be int, not float"),
        ({"op": {"a": 1}, "mesh_id": "m"}, "'op' must be str, not dict"),
        ({"op": "send", "mesh_id": {"x": [1]}, "rank": 0}, "'mesh_id' must be str, not dict"),
        ({"op": "send", "mesh_id": "m", "rank": 0, "line": ["c"]}, "'line' must be str, not list"),
        ({"op": "send", "mesh_id": "m", "rank": 0, "line": "p 1" * MAX_LINE}, "at most"),
    ],
)
def test_malformed_requests_answer_an_error_that_says_what_was_wrong(req, said):
    reply = handle(req)
    assert reply["status"] == "error" and said in reply["error"], reply


def test_a_request_with_no_fields_is_an_unknown_op():
    reply = handle({})
    assert reply["status"] == "error" and "expected attach, send, take or stacks" in reply["error"], reply


@pytest.mark.parametrize("after", [1e300, float("inf")])
def test_a_huge_delay_does_not_kill_the_long_call_timer(after):
    from jupyter_mesh.notebook.long_calls import _Alarm

    alarm, fired = _Alarm(), threading.Event()
    alarm.set(after, lambda: None)  # slow_call_after = 1e300: never due
    time.sleep(0.5)  # the timer thread starts its (long) wait
    alarm.set(0.01, fired.set)  # then set back to a few seconds: the view shows again
    assert fired.wait(30), "the timer thread died on the huge delay"
    assert alarm._thread is not None and alarm._thread.is_alive()


@pytest.mark.kernel
def test_junk_on_the_control_channel_gets_an_error_reply_not_a_traceback():
    with fresh_kernel() as k:
        k.ok("import jupyter_mesh")
        for junk in (["op", "attach"], {"op": "attach", "rank": {"deep": [[[1]]]}, "mesh_id": 7}):
            reply = k.debug_request(junk, raw=True)
            assert reply["status"] == "error", reply
            assert "must be" in reply["error"] or "JSON object" in reply["error"], reply
        assert "ok" in k.ok("print('ok')").stream("stdout")  # the kernel carries on
