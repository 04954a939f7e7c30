"""Tiller in Python: every LLM agent a long-lived, supervised actor, in this process.

    import asyncio, tiller

    @tiller.tool
    def add(a: float, b: float) -> str:
        \"\"\"Add two numbers.\"\"\"
        return str(a + b)

    async def main():
        async with await tiller.Supervisor.start() as supervisor:
            agent = await supervisor.spawn(system_prompt="Use add for sums.", tools=[add])
            async for event in agent.stream("What is 2 plus 3?"):
                if isinstance(event, tiller.MessageUpdate) and event.delta:
                    print(event.delta, end="")

    asyncio.run(main())

`tiller.blocking` has the same API for scripts; `tiller.Client` (with the `client` extra) speaks to `tiller serve`.
"""

import atexit

from . import _native
from . import agents
from .agents import Agent, RunResult, Subscription, Supervisor, Turn
from .errors import (
    AgentError,
    Busy,
    ConfigError,
    Disconnected,
    HttpError,
    NeedsApproval,
    NeedsInput,
    SpawnError,
    TillerError,
    ToolError,
)
from . import events
from .events import *  # noqa: F403 - the event dataclasses are the package's API
from .faux import Faux, FauxTurn
from .tools import AgentContext, Tool, ToolContext, ToolOutput, tool

Model = _native.Model

# The interpreter's exit shuts down the supervisors still running and waits for the Python tools' calls under
# way on Tiller's threads, before the interpreter goes.
atexit.register(agents._at_exit)


def __getattr__(name: str):
    # The client needs httpx (the `client` extra): imported when first asked for.
    if name in ("Client", "RemoteAgent", "RemoteSubscription"):
        from . import client

        return getattr(client, name)
    raise AttributeError(f"module 'tiller' has no attribute {name!r}")


__all__ = [
    "Agent", "AgentContext", "AgentError", "Busy", "Client", "ConfigError", "Disconnected", "Faux", "FauxTurn",
    "HttpError", "Model", "NeedsApproval", "NeedsInput", "RemoteAgent", "RemoteSubscription", "RunResult",
    "SpawnError", "Subscription", "Supervisor", "TillerError", "Tool", "ToolContext", "ToolError", "ToolOutput",
    "Turn", "tool",
    *events.__all__,
]
