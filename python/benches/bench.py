"""Tiller in Python, measured: each figure printed beside its floor from the same run.

    scripts/python.sh bench [--events N] [--calls N] [--prompts N]

1. A streamed event delivered to a Python `async for` (typed, from the agent's subscription): CPU per event,
   beside a bare `asyncio.Queue` hand-off of the same bytes from a Rust thread (target: at most 3x).
2. A Python tool's round trip (Rust asks, Python runs it, Rust has the result), plain and async: time per call
   beside an empty PyO3 call (target: at most 30 us on top), and beside the bare thread hop each one takes
   (to a waiting thread, to the event loop): what this machine's wake-ups cost.
3. One prompt that makes three tool calls, through Tiller's Python API, pydantic-ai and the OpenAI Agents SDK,
   each against the same scripted OpenAI-compatible server (its own process): CPU per prompt, as ratios.

CPU is the whole process's (`time.process_time()`: Python's thread, Tiller's threads, the peers' own).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

import tiller  # noqa: E402
from tiller import _native  # noqa: E402

EVENT = json.dumps(
    {"agent_id": "01a22064-7eba-7267-a0b7-eeccedf90f7e", "seq": 7,
     "event": {"type": "message_update", "assistant_message_event": {"type": "text_delta", "content_index": 0, "delta": "abcd"}}},
    separators=(",", ":"),
).encode()


def steal() -> int:
    """The hypervisor's stolen ticks so far (/proc/stat), to say what a figure lost."""
    with open("/proc/stat") as stat:
        return int(stat.readline().split()[8])


async def tiller_events(events: int, spacing_ms: float) -> float:
    """CPU seconds per event of an answer streamed in `events` pieces, read by `async for`."""
    faux = tiller.Faux(tiller.FauxTurn.text("abcd" * events, chunk_size=4, delay_ms=spacing_ms))
    async with await tiller.Supervisor.start() as supervisor:
        agent = await supervisor.spawn(model=faux)
        subscription = agent.subscribe()
        started = time.process_time()
        await agent.prompt("Stream.")
        seen = 0
        async for event in subscription:
            seen += 1
            if isinstance(event, tiller.AgentEnd):
                break
        return (time.process_time() - started) / seen


async def queue_floor(events: int, spacing_ms: float) -> float:
    """CPU seconds per event of the bare hand-off: a Rust thread, `call_soon_threadsafe`, an `asyncio.Queue`."""
    queue: asyncio.Queue[bytes] = asyncio.Queue()
    started = time.process_time()
    _native.queue_floor(asyncio.get_running_loop(), queue, events, int(spacing_ms * 1000), EVENT)
    for _ in range(events):
        await queue.get()
    return (time.process_time() - started) / events


@tiller.tool
def noop() -> str:
    """Does nothing."""
    return "ok"


@tiller.tool
async def async_noop() -> str:
    """Does nothing, awaited."""
    return "ok"


def tool_round_trips(calls: int) -> dict[str, float]:
    floor = _native.empty_call_floor(lambda: None, calls)
    blocking_hop = _native.blocking_hop_floor(calls)
    plain = _native.tool_round_trips(noop, calls)

    async def awaited() -> tuple[float, float]:
        return await _native.loop_hop_floor(calls), await _native.tool_round_trips(async_noop, calls)

    loop_hop, awaited_tool = asyncio.run(awaited())
    return {"floor": floor, "blocking_hop": blocking_hop, "plain": plain, "loop_hop": loop_hop, "async": awaited_tool}


# 3. The same prompt through three frameworks.

def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


PROMPT = "Please add these."


async def tiller_prompts(url: str, prompts: int) -> float:
    tool = tiller.tool(add)
    model = tiller.Model.openai_compatible(url, "scripted", api_key="unused")
    async with await tiller.Supervisor.start() as supervisor:
        async def once() -> None:
            agent = await supervisor.spawn(model=model, tools=[tool])
            result = await agent.run(PROMPT)
            assert result.text == "The sums are 3, 7 and 11.", result

        return await per_prompt(once, prompts)


async def pydantic_ai_prompts(url: str, prompts: int) -> float:
    from openai import AsyncOpenAI
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    async with AsyncOpenAI(base_url=url, api_key="unused") as client:
        model = OpenAIChatModel("scripted", provider=OpenAIProvider(openai_client=client))
        agent = Agent(model, tools=[add])

        async def once() -> None:
            result = await agent.run(PROMPT)
            assert result.output == "The sums are 3, 7 and 11.", result.output

        return await per_prompt(once, prompts)


async def openai_agents_prompts(url: str, prompts: int) -> float:
    from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    async with AsyncOpenAI(base_url=url, api_key="unused") as client:
        model = OpenAIChatCompletionsModel(model="scripted", openai_client=client)
        agent = Agent(name="adder", model=model, tools=[function_tool(add)])

        async def once() -> None:
            result = await Runner.run(agent, PROMPT)
            assert result.final_output == "The sums are 3, 7 and 11.", result.final_output

        return await per_prompt(once, prompts)


async def per_prompt(once, prompts: int) -> float:
    for _ in range(5):  # warm: imports, connections, caches
        await once()
    started = time.process_time()
    for _ in range(prompts):
        await once()
    return (time.process_time() - started) / prompts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--spacing-ms", type=float, default=1.0)
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--prompts", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    print(f"Tiller in Python on {os.cpu_count()} cores, Python {sys.version.split()[0]}; medians of {options.rounds} rounds (ranges)")

    ticks = steal()
    mine, floor = [], []
    for _ in range(options.rounds):  # alternated, so that a slow spell hurts both
        floor.append(asyncio.run(queue_floor(options.events, options.spacing_ms)))
        mine.append(asyncio.run(tiller_events(options.events, options.spacing_ms)))
    print(f"\n1. a streamed event to `async for` ({options.events} events, {options.spacing_ms} ms apart), CPU per event")
    show("asyncio.Queue hand-off from a Rust thread (floor)", floor, 1e6, "us")
    show("tiller: subscription, typed events", mine, 1e6, "us")
    print(f"   ratio {statistics.median(mine) / statistics.median(floor):.2f}x the floor (target <= 3x)")

    trips = [tool_round_trips(options.calls) for _ in range(options.rounds)]
    print(f"\n2. a Python tool's round trip ({options.calls} calls in a row), time per call")
    for key, label in (
        ("floor", "an empty PyO3 call (floor)"),
        ("blocking_hop", "an empty closure to a thread and back (hardware)"),
        ("plain", "a plain tool (a worker thread)"),
        ("loop_hop", "a reply through the running event loop (hardware)"),
        ("async", "an async tool (event loop)"),
    ):
        show(label, [t[key] for t in trips], 1e6, "us")
    for key, hop in (("plain", "blocking_hop"), ("async", "loop_hop")):
        over = statistics.median([t[key] - t["floor"] for t in trips]) * 1e6
        beyond = statistics.median([t[key] - t[hop] for t in trips]) * 1e6
        print(f"   {key}: {over:.1f} us on top of the PyO3 call (target <= 30 us); {beyond:.1f} us on top of its thread hop")

    server = subprocess.Popen([sys.executable, str(HERE.parent / "tests" / "scripted_openai.py")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        url = server.stdout.readline().strip()
        runs = {"tiller": [], "pydantic-ai": [], "openai-agents": []}
        for _ in range(options.rounds):
            runs["tiller"].append(asyncio.run(tiller_prompts(url, options.prompts)))
            runs["pydantic-ai"].append(asyncio.run(pydantic_ai_prompts(url, options.prompts)))
            runs["openai-agents"].append(asyncio.run(openai_agents_prompts(url, options.prompts)))
    finally:
        server.stdin.close()
        server.wait(timeout=30)
    print(f"\n3. one prompt, three tool calls, against the same scripted server ({options.prompts} prompts), CPU per prompt")
    for name, values in runs.items():
        show(name, values, 1e3, "ms")
    for peer in ("pydantic-ai", "openai-agents"):
        ratio = statistics.median(runs[peer]) / statistics.median(runs["tiller"])
        print(f"   {peer} / tiller: {ratio:.2f}x")
    print(f"\nstolen by the hypervisor meanwhile: {steal() - ticks} ticks")


def show(label: str, values: list[float], scale: float, unit: str) -> None:
    scaled = sorted(v * scale for v in values)
    print(f"   {label:<52} {statistics.median(scaled):8.1f} {unit}  ({scaled[0]:.1f}-{scaled[-1]:.1f})")


if __name__ == "__main__":
    main()
