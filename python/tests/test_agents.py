"""The runtime in this process: events, Python tools, steering, errors, many agents."""

from __future__ import annotations

import asyncio
import threading

import pytest

import tiller
from conftest import describe, until_end
from tiller import FauxTurn


def run(coroutine):
    return asyncio.run(coroutine)


def test_two_parallel_tools_end_as_they_finish_and_results_keep_call_order():
    # The Rust loop's test `parallel_tools_end_as_they_finish_but_results_keep_call_order`,
    # with its tools in Python: the first call can only finish once the second has.
    async def main():
        second_done = asyncio.Event()
        finished = []

        @tiller.tool
        async def echo(value: str) -> str:
            """Echo tool"""
            if value == "first":
                await second_done.wait()
            else:
                second_done.set()
            finished.append(value)
            return value

        faux = tiller.Faux(
            FauxTurn().with_tool_call("echo", {"value": "first"}, id="tool-1").with_tool_call(
                "echo", {"value": "second"}, id="tool-2"
            ),
            "done",
        )
        async with await tiller.Supervisor.start() as supervisor:
            agent = await supervisor.spawn(model=faux, tools=[echo])
            events = agent.subscribe()
            await agent.prompt("echo both")
            seen = await until_end(events)
            state = await agent.state()
        assert finished == ["second", "first"]
        assert describe(seen) == [
            "agent_start",
            "turn_start",
            "message_start user:echo both",
            "message_end user:echo both",
            "message_start assistant",
            "message_update tool_call_start",
            "message_update tool_call_delta",
            "message_update tool_call_end",
            "message_update tool_call_start",
            "message_update tool_call_delta",
            "message_update tool_call_end",
            "message_end assistant",
            "tool_execution_start tool-1",
            "tool_execution_start tool-2",
            "tool_execution_end tool-2",
            "tool_execution_end tool-1",
            "message_start tool_result:tool-1",
            "message_end tool_result:tool-1",
            "message_start tool_result:tool-2",
            "message_end tool_result:tool-2",
            'turn_end ToolUse ["tool-1", "tool-2"]',
            "turn_start",
            "message_start assistant",
            "message_update text_start",
            "message_update text_delta",
            "message_update text_end",
            "message_end assistant",
            "turn_end Stop []",
            "agent_end Completed 5",
        ]
        assert [m["role"] for m in state["messages"]] == ["user", "assistant", "tool_result", "tool_result", "assistant"]
        # Every event carries its agent and its number, in order.
        assert [event.seq for event in seen] == list(range(seen[0].seq, seen[0].seq + len(seen)))
        assert {event.agent_id for event in seen} == {agent.id}

    run(main())


def test_a_raising_tool_is_an_error_result_and_the_run_goes_on():
    @tiller.tool
    def divide(a: int, b: int) -> float:
        """Divide a by b."""
        return a / b

    @tiller.tool
    def refuse() -> str:
        """Always refuses."""
        raise tiller.ToolError("not today")

    async def main():
        faux = tiller.Faux(
            FauxTurn().with_tool_call("divide", {"a": 1, "b": 0}, id="c1").with_tool_call("refuse", {}, id="c2"),
            "I could not.",
        )
        async with await tiller.Supervisor.start() as supervisor:
            agent = await supervisor.spawn(model=faux, tools=[divide, refuse])
            result = await agent.run("Divide 1 by 0.")
        assert result.end == "completed"
        assert result.text == "I could not."
        results = [m for m in result.messages if m["role"] == "tool_result"]
        assert [(r["tool_call_id"], r["is_error"], r["content"][0]["text"]) for r in results] == [
            ("c1", True, "ZeroDivisionError: division by zero"),
            ("c2", True, "not today"),
        ]

    run(main())


def test_a_tool_that_asks_runs_again_with_the_answer():
    asked = []

    @tiller.tool
    def remind(what: str, ctx: tiller.ToolContext, when: str | None = None) -> str:
        """Set a reminder.

        Args:
            what: What to remind of.
            when: When; asked of the user when missing.
        """
        asked.append((when, ctx.answered))
        if when is None:
            raise tiller.NeedsInput("when", "When should I remind you?")
        return f"Reminder set: {what}, {when}."

    async def main():
        faux = tiller.Faux(FauxTurn.tool_call("remind", {"what": "call Juan"}, id="r1"), "Done.")
        async with await tiller.Supervisor.start() as supervisor:
            agent = await supervisor.spawn(model=faux, tools=[remind])
            events = agent.subscribe()
            await agent.prompt("Remind me to call Juan.")
            first = await until_end(events)
            request = next(e for e in first if isinstance(e, tiller.InputRequested))
            assert (request.tool_call_id, request.field, request.question) == ("r1", "when", "When should I remind you?")
            assert first[-1].reason == "parked"
            await agent.reply("r1", "Friday at 10")
            second = await until_end(events)
        assert asked == [(None, False), ("Friday at 10", True)]
        end = next(e for e in second if isinstance(e, tiller.ToolExecutionEnd))
        assert (end.is_error, end.result["content"][0]["text"]) == (False, "Reminder set: call Juan, Friday at 10.")
        assert second[-1].reason == "completed"

    run(main())


def test_a_tool_that_needs_approval_runs_once_approved_and_not_when_denied():
    ran = []

    @tiller.tool(needs_approval="Deleting cannot be undone.")
    def delete(path: str, ctx: tiller.ToolContext) -> str:
        """Delete a file."""
        ran.append((path, ctx.approved, ctx.idempotency_key))
        return f"deleted {path}"

    async def main():
        faux = tiller.Faux(
            FauxTurn.tool_call("delete", {"path": "a.txt"}, id="d1"),
            "Deleted.",
            FauxTurn.tool_call("delete", {"path": "b.txt"}, id="d2"),
            "Kept it.",
        )
        async with await tiller.Supervisor.start() as supervisor:
            agent = await supervisor.spawn(model=faux, tools=[delete])
            events = agent.subscribe()
            await agent.prompt("Delete a.txt")
            parked = await until_end(events)
            request = next(e for e in parked if isinstance(e, tiller.ApprovalRequested))
            assert (request.tool_call_id, request.args, request.reason) == ("d1", {"path": "a.txt"}, "Deleting cannot be undone.")
            assert ran == []
            await agent.approve("d1")
            await until_end(events)
            await agent.prompt("Delete b.txt")
            await until_end(events)
            await agent.deny("d2", "not that one")
            denied = await until_end(events)
        assert ran == [("a.txt", True, "d1")]
        end = next(e for e in denied if isinstance(e, tiller.ToolExecutionEnd))
        assert end.is_error and "not that one" in end.result["content"][0]["text"]

    run(main())


def test_steering_while_a_python_tool_runs_cancels_the_call_still_running():
    # As the Rust loop's `interrupting_steering_cancels_parallel_calls_still_running`:
    # the steering is taken when the quick call finishes; the one still running is
    # cancelled (it sees asyncio.CancelledError) and answered as skipped.
    release_quick = threading.Event()
    saw_cancel = []

    @tiller.tool
    def quick() -> str:
        """Quick."""
        release_quick.wait(timeout=30)
        return "quick"

    @tiller.tool
    async def waits() -> str:
        """Waits for cancellation."""
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            saw_cancel.append("cancelled")
            raise
        return "never"

    async def main():
        faux = tiller.Faux(FauxTurn().with_tool_call("quick", {}, id="tool-1").with_tool_call("waits", {}, id="tool-2"), "ok")
        async with await tiller.Supervisor.start() as supervisor:
            agent = await supervisor.spawn(model=faux, tools=[quick, waits])
            events = agent.subscribe()
            await agent.prompt("go")
            started = set()
            seen = []
            async for event in events:
                seen.append(event)
                if isinstance(event, tiller.ToolExecutionStart):
                    started.add(event.tool_call_id)
                    if started == {"tool-1", "tool-2"}:
                        await agent.steer("change of plan")
                        release_quick.set()
                if isinstance(event, tiller.AgentEnd):
                    break
            state = await agent.state()
        assert saw_cancel == ["cancelled"]
        messages = state["messages"]
        texts = [m["content"][0]["text"] if m["role"] != "assistant" else m["role"] for m in messages]
        assert texts == ["go", "assistant", "quick", "Skipped due to queued user message.", "change of plan", "assistant"]
        assert seen[-1].reason == "completed"

    run(main())


def test_a_prompt_while_busy_is_refused_and_leaves_the_run_alone():
    gate = threading.Event()

    @tiller.tool
    def slow() -> str:
        """Slow."""
        gate.wait(timeout=30)
        return "slow done"

    async def main():
        faux = tiller.Faux(FauxTurn.tool_call("slow", {}, id="s1"), "finished")
        async with await tiller.Supervisor.start() as supervisor:
            agent = await supervisor.spawn(model=faux, tools=[slow])
            events = agent.subscribe()
            await agent.prompt("first")
            async for event in events:
                if isinstance(event, tiller.ToolExecutionStart):
                    break
            with pytest.raises(tiller.Busy) as refused:
                await agent.prompt("second")
            assert refused.value.kind == "busy"
            assert "steer()" in str(refused.value)
            gate.set()
            seen = await until_end(events)
            assert seen[-1].reason == "completed"
            state = await agent.state()
        assert [m["role"] for m in state["messages"]] == ["user", "assistant", "tool_result", "assistant"]

    run(main())


def test_bad_settings_are_typed_errors():
    async def main():
        async with await tiller.Supervisor.start() as supervisor:
            with pytest.raises(tiller.ConfigError) as unknown:
                await supervisor.spawn(model="nowhere/nothing")
            assert unknown.value.kind == "unknown_model"
            with pytest.raises(tiller.ConfigError) as missing:
                await supervisor.spawn(file="/nonexistent/agent.yaml")
            assert missing.value.kind == "agent_file"
            with pytest.raises(TypeError):
                await supervisor.spawn(tools=[lambda: None])
            await supervisor.spawn(name="one")
            with pytest.raises(tiller.SpawnError) as taken:
                await supervisor.spawn(name="one")
            assert taken.value.kind == "name_taken"
        with pytest.raises(tiller.ConfigError) as store:
            await tiller.Supervisor.start("mysql://nowhere")
        assert store.value.kind == "store"

    run(main())


def test_the_context_reaches_tools_and_headers_make_one():
    seen = []

    @tiller.tool
    def whoami(ctx: tiller.ToolContext) -> str:
        """Who asks."""
        seen.append((ctx.agent.user_id, ctx.agent.tenant_id, ctx.agent.evaluation, ctx.state("visits", 0)))
        ctx.set_state("visits", ctx.state("visits", 0) + 1)
        return ctx.agent.user_id or "nobody"

    context = tiller.AgentContext.from_headers({"X-User-Id": "u-7", "x-tenant-id": "acme", "X-Is-Eval": "1", "X-Other": "x"})
    assert (context.user_id, context.tenant_id, context.evaluation, context.client_id) == ("u-7", "acme", True, None)
    visitor = tiller.AgentContext.from_headers({"X-Anonymous-Id": "v-1"})
    assert (visitor.user_id, visitor.anonymous_id) == (None, "v-1")

    async def main():
        faux = tiller.Faux(FauxTurn.tool_call("whoami", {}), "You are u-7.", FauxTurn.tool_call("whoami", {}), "Again.")
        async with await tiller.Supervisor.start() as supervisor:
            agent = await supervisor.spawn(model=faux, tools=[whoami], context=context)
            await agent.run("Who am I?")
            await agent.run("And now?")

    run(main())
    # The state a call set is the agent's from then on.
    assert seen == [("u-7", "acme", True, 0), ("u-7", "acme", True, 1)]


def test_the_blocking_api_runs_a_script():
    import tiller.blocking as blocking

    @tiller.tool
    async def shout(text: str) -> str:
        """Shout."""
        return text.upper()

    faux = tiller.Faux(FauxTurn.tool_call("shout", {"text": "hi"}), "HI")
    with blocking.Supervisor.start() as supervisor:
        agent = supervisor.spawn(model=faux, tools=[shout], name="shouter")
        lines = describe(list(agent.stream("Shout hi.")))
        assert lines[-1] == "agent_end Completed 4"
        assert supervisor.find("shouter").id == agent.id
        assert agent.run("Again?").end == "error"  # the script is spent: the model call fails
        assert len(agent.state()["messages"]) == 6


def test_a_thousand_agents_spawned_and_run_from_python():
    async def main():
        async with await tiller.Supervisor.start() as supervisor:
            agents = await asyncio.gather(*(supervisor.spawn(model=tiller.Model.demo()) for _ in range(1000)))
            assert len(supervisor) == 1000
            results = await asyncio.gather(*(agent.run(f"Hello {n}") for n, agent in enumerate(agents)))
        assert all(r.end == "completed" for r in results)
        assert results[999].text.startswith('You said: "Hello 999".')
        assert len({agent.id for agent in agents}) == 1000

    run(main())


def test_plain_tools_of_one_turn_run_at_once():
    # Each waits for the other: they finish only if they run on two threads together.
    first_started, second_started = threading.Event(), threading.Event()

    @tiller.tool
    def first() -> str:
        """First."""
        first_started.set()
        return "first" if second_started.wait(timeout=30) else "alone"

    @tiller.tool
    def second() -> str:
        """Second."""
        second_started.set()
        return "second" if first_started.wait(timeout=30) else "alone"

    async def main():
        faux = tiller.Faux(FauxTurn().with_tool_call("first", {}, id="a").with_tool_call("second", {}, id="b"), "Both.")
        async with await tiller.Supervisor.start() as supervisor:
            agent = await supervisor.spawn(model=faux, tools=[first, second])
            return await agent.run("Both.")

    result = asyncio.run(main())
    assert [m["content"][0]["text"] for m in result.messages if m["role"] == "tool_result"] == ["first", "second"]
