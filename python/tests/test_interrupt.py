"""Ctrl-C in a script waiting for a run: the wait ends with KeyboardInterrupt and the run is aborted cleanly."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    import json, threading, tiller
    import tiller.blocking as blocking

    release = threading.Event()

    @tiller.tool
    def wait_forever(ctx: tiller.ToolContext) -> str:
        \"\"\"Waits until cancelled.\"\"\"
        print("in the tool", flush=True)
        while not ctx.cancelled:
            release.wait(0.01)
        print("the tool saw the cancellation", flush=True)
        return "stopped"

    faux = tiller.Faux(tiller.FauxTurn.tool_call("wait_forever", {}, id="w1"))
    with blocking.Supervisor.start() as supervisor:
        agent = supervisor.spawn(model=faux, tools=[wait_forever])
        try:
            agent.run("Wait.")
        except KeyboardInterrupt:
            agent.wait_for_idle()
            state = agent.state()
            print(json.dumps([m.get("stop_reason") or m["content"][0].get("text") for m in state["messages"]]), flush=True)
    """
)


def test_ctrl_c_aborts_the_run_a_script_waits_for():
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdout.readline() == "in the tool\n"
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=30)
    assert child.returncode == 0, err
    # The run ended aborted, its call answered; the tool's thread heard of it too (in its own time).
    assert sorted(out.splitlines()) == sorted(
        ['["Wait.", "tool_use", "the call was cancelled", "aborted"]', "the tool saw the cancellation"]
    )
