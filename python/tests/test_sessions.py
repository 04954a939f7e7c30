"""Sessions from Python: an agent's conversation survives its process, even `kill -9`."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap

import pytest

import tiller
from tiller import FauxTurn

CHILD = textwrap.dedent(
    """
    import asyncio, sys, tiller
    from tiller import FauxTurn

    @tiller.tool
    def slow_write(text: str) -> str:
        \"\"\"Writes slowly.\"\"\"
        print("in the tool", flush=True)
        sys.stdin.readline()  # never answered: the process is killed here
        return "written"

    async def main():
        supervisor = await tiller.Supervisor.start(sys.argv[1])
        faux = tiller.Faux("Noted: 4711.", FauxTurn.tool_call("slow_write", {"text": "4711"}, id="w1"))
        agent = await supervisor.spawn(model=faux, tools=[slow_write], session="notes-1")
        await agent.run("Remember: the code is 4711.")
        await agent.run("Write it down.")

    asyncio.run(main())
    """
)


def test_a_session_resumes_after_its_process_is_killed(tmp_path):
    store = f"sqlite://{tmp_path}/sessions.db"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, store], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline() == "in the tool\n"
        os.kill(child.pid, signal.SIGKILL)
    finally:
        assert child.wait(timeout=30) == -signal.SIGKILL

    @tiller.tool
    def slow_write(text: str) -> str:
        """Writes slowly."""
        return "written"

    async def main():
        async with await tiller.Supervisor.start(store) as supervisor:
            faux = tiller.Faux("The code is 4711.")
            agent = await supervisor.spawn(model=faux, tools=[slow_write], session="notes-1")
            before = (await agent.state())["messages"]
            result = await agent.run("What is the code?")
            after = (await agent.state())["messages"]
        return before, result, after

    before, result, after = asyncio.run(main())
    # What was durable before the kill: the first run, and the second up to its tool
    # call (written ahead of the call); the call that never finished is answered.
    assert [(m["role"], _text(m)) for m in before] == [
        ("user", "Remember: the code is 4711."),
        ("assistant", "Noted: 4711."),
        ("user", "Write it down."),
        ("assistant", ""),
        ("tool_result", 'Tool call "slow_write" was interrupted: the agent stopped before it finished and was brought back from its session.'),
    ]
    assert before[3]["content"][0]["id"] == "w1"
    assert before[4]["tool_call_id"] == "w1" and before[4]["is_error"]
    assert result.text == "The code is 4711."
    assert len(after) == 7


def _text(message):
    return "".join(part.get("text", "") for part in message["content"] if part.get("type") == "text")


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_session_resumes_by_id_in_another_supervisor(kind, tmp_path, request):
    store = f"sqlite://{tmp_path}/sessions.db" if kind == "sqlite" else request.getfixturevalue("postgres_url")
    session = f"resume-{kind}-{os.getpid()}"

    async def main():
        async with await tiller.Supervisor.start(store) as supervisor:
            agent = await supervisor.spawn(model=tiller.Faux("Hello, Ada."), session=session, name="greeter")
            await agent.run("My name is Ada.")
        async with await tiller.Supervisor.start(store) as supervisor:
            agent = await supervisor.spawn(model=tiller.Faux("You are Ada."), session=session)
            assert agent.session_id == session
            result = await agent.run("Who am I?")
            return result, (await agent.state())["messages"]

    result, messages = asyncio.run(main())
    assert result.text == "You are Ada."
    assert [_text(m) for m in messages] == ["My name is Ada.", "Hello, Ada.", "Who am I?", "You are Ada."]
