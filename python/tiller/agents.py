"""The supervisor and its agents, in this process: every operation one message to the agent's actor, on
Tiller's own runtime.

`Supervisor` and `Agent` are awaited (`await agent.run(...)`); `tiller.blocking` has the same API for scripts,
each call waiting with the GIL released (Ctrl-C aborts the run waited for). Events are an `async for` (or a
plain `for`) over `agent.subscribe()`.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable, Iterable, TypeVar

from . import _native
from .events import AgentEnd, Event, parse_batch
from .tools import AgentContext, Tool, _decode, _schema

T = TypeVar("T")


@dataclass
class RunResult:
    """What one run did: why it ended (`end`: `completed`, `aborted`, `error`, `parked`, ...), the text of its
    last answer, its structured output, its tool calls, usage and error, and its messages (dicts)."""

    end: str
    text: str = ""
    output: Any = None
    output_error: Any = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    usage: dict[str, Any] = field(default_factory=dict)
    stop_reason: str | None = None
    error: str | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)
    budget_exceeded: Any = None
    guardrail_tripped: Any = None

    @classmethod
    def _from_json(cls, text: str, output: type | None = None) -> RunResult:
        data = json.loads(text)
        known = cls.__dataclass_fields__
        result = cls(**{key: value for key, value in data.items() if key in known})
        if output is not None and result.output is not None:
            result.output = _decode(result.output, output)
        return result


@dataclass
class Turn:
    """A finished turn, as `run_until` and `stop_when` read it."""

    turn: int
    text: str
    tool_calls: list[dict[str, Any]]
    tool_results: list[dict[str, Any]]

    def called(self, name: str) -> bool:
        """Whether the turn called the tool `name`."""
        return any(call["name"] == name for call in self.tool_calls)

    def has_tool_calls(self) -> bool:
        """Whether the response called any tool."""
        return bool(self.tool_calls)

    def get_result(self, name: str) -> dict[str, Any] | None:
        """The result of the turn's first call of the tool `name`, if it made one."""
        return next((result for result in self.tool_results if result["tool_name"] == name), None)


def _turn_predicate(predicate: Callable[[Turn], bool] | None) -> Callable[[str], bool] | None:
    if predicate is None:
        return None
    return lambda turn: bool(predicate(Turn(**json.loads(turn))))


def _output_schema(output: Any) -> dict[str, Any] | None:
    """A type (a pydantic model, a dataclass, a TypedDict) as a structured output: its name and JSON Schema."""
    if output is None:
        return None
    schema = _schema(output)
    if schema.get("type") != "object":
        raise TypeError(f"output must be a pydantic model, a dataclass or a TypedDict, not {output!r}")
    return {"name": getattr(output, "__name__", "output"), "schema": schema}


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value)


class Subscription:
    """An agent's events from the moment of `subscribe()`: `async for event in subscription` or, in a script,
    `for event in subscription`. Events arrive in batches (whatever is ready, in one hand-off); `close()` ends
    it."""

    def __init__(self, native: Any) -> None:
        self._native = native
        self._ready: deque[Event] = deque()
        self._done = False
        self._pumping = False
        self._waiter: asyncio.Future[None] | None = None

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Event:
        if not self._ready:
            if self._done:
                raise StopAsyncIteration
            loop = asyncio.get_running_loop()
            if not self._pumping:
                self._pumping = True
                # The pump holds the subscription weakly: dropped unread, it ends.
                self._native.pump(loop, _deliverer(weakref.ref(self)))
            self._waiter = loop.create_future()
            await self._waiter
            if not self._ready:
                raise StopAsyncIteration
        return self._take()

    def _deliver(self, batch: bytes | None) -> None:
        if self._done and batch is not None:
            return  # closed: what was under way is not told
        if batch is None:
            self._done = True
        else:
            self._ready.extend(parse_batch(batch))
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _take(self) -> Event:
        event = self._ready.popleft()
        if not self._ready and not self._done:
            self._native.taken()
        return event

    def __iter__(self) -> Subscription:
        return self

    def __next__(self) -> Event:
        if not self._ready:
            if self._done:
                raise StopIteration
            batch = self._native.next_batch()
            if batch is None:
                self._done = True
                raise StopIteration
            self._ready.extend(parse_batch(batch))
        return self._ready.popleft()

    def close(self) -> None:
        """Ends the subscription."""
        self._done = True
        self._native.close()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


def _deliverer(subscription: weakref.ref[Subscription]) -> Callable[[bytes | None], None]:
    def deliver(batch: bytes | None) -> None:
        reader = subscription()
        if reader is not None:
            reader._deliver(batch)

    return deliver


class Agent:
    """A handle to one agent. Each method sends one operation to the agent's actor and is awaited; it returns
    once the operation is accepted (`prompt`) or done (`run`, `state`)."""

    _blocking = False

    def __init__(self, native: Any) -> None:
        self._native = native

    @property
    def id(self) -> str:
        """The agent's id."""
        return self._native.id

    @property
    def session_id(self) -> str:
        """The session that keeps its conversation (resume it with `spawn(session=...)`)."""
        return self._native.session_id

    @property
    def name(self) -> str | None:
        """Its name, if it was given one."""
        return self._native.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self.id!r}, session_id={self.session_id!r})"

    def _op(self, call: Callable[..., Any], *args: Any, then: Callable[[Any], T] | None = None) -> Any:
        return _finish(call(*args, blocking=self._blocking), self._blocking, then)

    def submit(self, op: dict[str, Any], key: str | None = None) -> Awaitable[None]:
        """Sends one `Op`, as its JSON (`{"type": "prompt", "text": ...}`, `steer`, `follow_up`, `answer`,
        `approve`, `deny`, `reset`, `clear_queues`, ...); returns once it is accepted and stored. With `key`, an
        idempotency key: sent again with it (after a timeout, say), the op is not applied twice."""
        return self._op(self._native.submit, json.dumps(op), key)

    def prompt(self, text: str) -> Awaitable[None]:
        """Starts a run with `text`; raises `tiller.Busy` while a run goes on."""
        return self.submit({"type": "prompt", "text": text})

    def run(
        self,
        text: str,
        *,
        until: Callable[[Turn], bool] | None = None,
        stop_when: Callable[[Turn], bool] | None = None,
        output: type | None = None,
    ) -> Awaitable[RunResult]:
        """Runs `text` to the run's end. For this run alone: `until` keeps it going until it accepts a turn (each
        answer it refuses is followed by "The task is not finished yet: keep going."), `stop_when` ends it after
        a turn it accepts, and `output` (a pydantic model, a dataclass or a TypedDict) is the structured output
        asked for: `result.output` is an instance of it. Cancelled (Ctrl-C), it aborts the run."""
        waited = self._run(text, until, stop_when, output)

        async def guarded() -> RunResult:
            try:
                return await waited
            except asyncio.CancelledError:
                self.abort()
                raise

        return guarded()

    def _run(self, text: str, until: Any, stop_when: Any, output: type | None) -> Any:
        """The native run, its result read as a `RunResult` (awaited, or at once when blocking)."""
        return self._op(
            self._native.run,
            text,
            _turn_predicate(until),
            _turn_predicate(stop_when),
            _json(_output_schema(output)),
            then=lambda summary: RunResult._from_json(summary, output),
        )

    def run_until(self, text: str, predicate: Callable[[Turn], bool]) -> Awaitable[RunResult]:
        """Runs `text` until `predicate` accepts a turn (or the turn limit ends the run)."""
        return self.run(text, until=predicate)

    def steer(self, text: str) -> Awaitable[None]:
        """Redirects the run going on: `text` joins it at its next turn."""
        return self.submit({"type": "steer", "text": text})

    def follow_up(self, text: str) -> Awaitable[None]:
        """Queues `text` for when the run would end (or starts a run when idle)."""
        return self.submit({"type": "follow_up", "text": text})

    def answer(self, request_id: str, text: str) -> Awaitable[None]:
        """Answers the question of the waiting call `request_id` (an `InputRequested`'s `tool_call_id`)."""
        return self.submit({"type": "answer", "request_id": request_id, "text": text})

    def approve(self, request_id: str) -> Awaitable[None]:
        """Approves the call `request_id`, waiting for approval; the run goes on."""
        return self.submit({"type": "approve", "request_id": request_id})

    def deny(self, request_id: str, reason: str | None = None) -> Awaitable[None]:
        """Denies the call `request_id`: its result is an error saying so, and the run goes on."""
        return self.submit({"type": "deny", "request_id": request_id, "reason": reason})

    def reply(self, request_id: str, answer: str | bool) -> Awaitable[None]:
        """Replies to a waiting call: `True`/`False` approves or denies it, a text answers its question."""
        if answer is True:
            return self.approve(request_id)
        if answer is False:
            return self.deny(request_id)
        return self.answer(request_id, answer)

    def abort(self) -> None:
        """Aborts the run going on: tools are cancelled, every call gets a result, the run ends `aborted`."""
        self._native.abort()

    def reset(self) -> Awaitable[None]:
        """Aborts any run, then clears the transcript, both queues and the error."""
        return self.submit({"type": "reset"})

    def compact(self, instructions: str | None = None) -> Awaitable[dict[str, Any]]:
        """Compacts the transcript now (a summary in place of its oldest messages): the compaction's report."""
        return self._op(self._native.compact, instructions, then=json.loads)

    def state(self) -> Awaitable[dict[str, Any]]:
        """The agent's state: its messages, whether it is streaming, its queues, error and settings."""
        return self._op(self._native.state, then=json.loads)

    def wait_for_idle(self) -> Awaitable[None]:
        """Waits until no run goes on."""
        return self._op(self._native.wait_for_idle)

    def subscribe(self) -> Subscription:
        """The agent's events from now on."""
        return Subscription(self._native.subscribe())

    async def stream(self, text: str) -> AsyncIterator[Event]:
        """Prompts with `text` and yields the run's events, its `AgentEnd` last."""
        events = self.subscribe()
        try:
            await self.prompt(text)
            async for event in events:
                yield event
                if isinstance(event, AgentEnd):
                    return
        except asyncio.CancelledError:
            self.abort()
            raise
        finally:
            events.close()


class Supervisor:
    """Supervises agents, each a long-lived actor whose conversation is a durable session. Start one with
    `await Supervisor.start()` (sessions in memory), `start("sqlite:///path/sessions.db")` or
    `start("postgres://...")`; `async with` shuts it down."""

    _blocking = False
    _agent = Agent

    def __init__(self, native: Any) -> None:
        self._native = native
        _LIVE.add(self)

    @classmethod
    def start(cls, store: str | None = None) -> Any:
        """A supervisor keeping sessions at `store` (a URL), in memory when `None`."""
        return _finish(_native.Supervisor.start(store, blocking=cls._blocking), cls._blocking, cls)

    def spawn(
        self,
        *,
        model: Any = None,
        file: str | os.PathLike[str] | None = None,
        definition: dict[str, Any] | None = None,
        system_prompt: str | None = None,
        tools: Iterable[Tool] = (),
        name: str | None = None,
        session: str | None = None,
        context: AgentContext | None = None,
        output: type | None = None,
    ) -> Awaitable[Agent]:
        """Spawns an agent from an agent file (`file`), a definition (an `AgentDefinition` as a dict: `model`,
        `system_prompt`, `tools` by name, `run` options, ...) or keyword settings, with Python `tools`.

        `model` is a `tiller.Model`, a `tiller.Faux` or a catalog name (`"openai/gpt-4o-mini"`); without one,
        the environment's (`TILLER_MODEL`, `OPENAI_API_KEY`, ...), else the scripted demo model. With the id of
        a `session` the store holds, the agent resumes that conversation. `output` (a pydantic model, a
        dataclass or a TypedDict) is the structured output of each of its runs.
        """
        tools = list(tools)
        for each in tools:
            if not isinstance(each, Tool):
                raise TypeError(f"tools must be made by @tiller.tool, not {type(each).__name__}")
        options = {
            "file": os.fspath(file) if file is not None else None,
            "definition": definition,
            "system_prompt": system_prompt,
            "name": name,
            "session": session,
            "context": context._to_dict() if context is not None else None,
            "output": _output_schema(output),
        }
        native = self._native.spawn(_model(model), tools, json.dumps(options), blocking=self._blocking)
        return _finish(native, self._blocking, self._agent)

    def get(self, id: str) -> Agent | None:
        """The live agent with this id."""
        native = self._native.get(id)
        return self._agent(native) if native is not None else None

    def find(self, name: str) -> Agent | None:
        """The live agent with this name."""
        native = self._native.find(name)
        return self._agent(native) if native is not None else None

    def __len__(self) -> int:
        return len(self._native)

    def shutdown(self) -> Awaitable[None]:
        """Stops every agent (their sessions stay in the store) and the supervisor."""
        _LIVE.discard(self)
        return _finish(self._native.shutdown(blocking=self._blocking), self._blocking, None)

    async def __aenter__(self) -> Supervisor:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.shutdown()


# The supervisors not shut down yet: the interpreter's exit shuts them down (see `_at_exit`).
_LIVE: weakref.WeakSet[Supervisor] = weakref.WeakSet()


def _at_exit() -> None:
    """At the interpreter's exit: every supervisor still running is shut down (runs aborted, every finished
    message stored), then the tool workers finish the calls they have and end, before the interpreter does.
    A tool that never returns holds the exit, as a Python thread would."""
    for supervisor in list(_LIVE):
        try:
            supervisor._native.shutdown(blocking=True)
        except Exception as error:  # the exit goes on: one supervisor's failure stops no other's shutdown
            sys.stderr.write(f"tiller: a supervisor could not shut down at exit: {error}\n")
    _native.close()


def _model(model: Any) -> Any:
    if model is None or isinstance(model, _native.Model):
        return model
    if isinstance(model, str):
        return _native.Model.find(model)
    native = getattr(model, "_model", None)
    if callable(native):  # a tiller.Faux
        return native()
    raise TypeError(f"model must be a tiller.Model, a tiller.Faux or a catalog name, not {type(model).__name__}")


def _finish(value: Any, blocking: bool, then: Callable[[Any], T] | None) -> Any:
    """The native call's result, converted by `then`: at once when it blocked, else when awaited."""
    if blocking:
        return then(value) if then is not None else value
    if then is None:
        return value

    async def converted() -> T:
        return then(await value)

    return converted()
