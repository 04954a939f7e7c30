"""Tiller's API for scripts: the same `Supervisor` and `Agent` as `tiller`'s, each call waiting for its
answer with the GIL released (other Python threads run meanwhile). Ctrl-C interrupts a wait; during `run` it
aborts the run first.

    import tiller.blocking as tiller_blocking

    with tiller_blocking.Supervisor.start() as supervisor:
        agent = supervisor.spawn(system_prompt="Answer briefly.")
        print(agent.run("Why is the sky blue?").text)
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from . import agents
from .events import AgentEnd, Event


class Agent(agents.Agent):
    """A handle to one agent; each method returns once its operation is accepted (`prompt`) or done."""

    _blocking = True

    def run(  # type: ignore[override]
        self,
        text: str,
        *,
        until: Callable[[agents.Turn], bool] | None = None,
        stop_when: Callable[[agents.Turn], bool] | None = None,
        output: type | None = None,
    ) -> agents.RunResult:
        """Runs `text` to the run's end (see `tiller.Agent.run`); Ctrl-C aborts the run and raises
        `KeyboardInterrupt`."""
        try:
            return self._run(text, until, stop_when, output)
        except KeyboardInterrupt:
            self.abort()
            raise

    def stream(self, text: str) -> Iterator[Event]:  # type: ignore[override]
        """Prompts with `text` and yields the run's events, its `AgentEnd` last; Ctrl-C aborts the run."""
        events = self.subscribe()
        try:
            self.prompt(text)
            for event in events:
                yield event
                if isinstance(event, AgentEnd):
                    return
        except KeyboardInterrupt:
            self.abort()
            raise
        finally:
            events.close()


class Supervisor(agents.Supervisor):
    """A supervisor whose calls block; `with` shuts it down."""

    _blocking = True
    _agent = Agent

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()
