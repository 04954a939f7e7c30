"""A client for `tiller serve` (on httpx, the `client` extra): the same handle API as in-process agents, over
Tiller's HTTP API.

    async with tiller.Client("http://127.0.0.1:8787", token="...") as client:
        agent = await client.spawn("calculator")
        async for event in agent.stream("What is 2 + 3?"):
            if isinstance(event, tiller.MessageUpdate) and event.delta:
                print(event.delta, end="")

Events come from the agent's lean server-sent events as the same dataclasses as in-process; a stream that
breaks is resumed with `Last-Event-ID`, each event delivered once. Refusals are `tiller.Busy` (409) or
`tiller.HttpError` with the server's problem kind.
"""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from typing import Any, AsyncIterator, Callable

import httpx

from .agents import RunResult
from .errors import AgentError, Busy, Disconnected, HttpError
from .events import AgentEnd, AgentStopped, Event, from_envelope

Token = str | Callable[[], str]

# A run waited for, a compaction or an event stream may take as long as it takes; connecting may not.
_NO_READ_TIMEOUT = httpx.Timeout(30.0, read=None)


class Client:
    """A connection to `tiller serve` at `base_url`. `token` is a bearer token of the server's `--tokens` file or a
    JSON Web Token, or a function giving the current one (called for each request, so a JWT can be renewed).
    `max_reconnects` bounds how often an event stream is resumed in a row before `tiller.Disconnected`."""

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8787",
        *,
        token: Token | None = None,
        timeout: float = 30.0,
        max_reconnects: int = 5,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self._token = token
        self.max_reconnects = max_reconnects
        self._http = http or httpx.AsyncClient(base_url=base_url.rstrip("/"), timeout=timeout)

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Closes the connections."""
        await self._http.aclose()

    def _headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        headers = dict(extra or {})
        if self._token is not None:
            token = self._token() if callable(self._token) else self._token
            headers["authorization"] = f"Bearer {token}"
        return headers

    async def _request(self, method: str, path: str, body: Any = None, *, timeout: Any = httpx.USE_CLIENT_DEFAULT, **params: Any) -> Any:
        try:
            response = await self._http.request(
                method,
                path,
                headers=self._headers(),
                json=body,
                params={key: value for key, value in params.items() if value is not None} or None,
                timeout=timeout,
            )
        except httpx.TransportError as error:
            raise HttpError(f"{method} {path}: the server could not be reached: {error}", "unreachable") from error
        if response.status_code >= 400:
            raise _problem(response)
        if response.status_code in (202, 204) or not response.content:
            return None
        return response.json()

    async def spawn(
        self,
        definition: str | None = None,
        *,
        inline: dict[str, Any] | None = None,
        version: str | None = None,
        id: str | None = None,
        name: str | None = None,
    ) -> RemoteAgent:
        """Creates an agent of the server's `definition` (or of an agent file sent `inline`, as JSON)."""
        body = {"definition": definition, "inline": inline, "version": version, "id": id, "name": name}
        shown = await self._request("POST", "/agents", {key: value for key, value in body.items() if value is not None})
        return RemoteAgent(self, shown["id"], shown.get("session_id", shown["id"]))

    def agent(self, id: str) -> RemoteAgent:
        """A handle to the agent `id` the server has."""
        return RemoteAgent(self, id, id)

    async def resume(self, session_id: str, definition: str) -> RemoteAgent:
        """Brings an agent back to the stored session `session_id`, with the tools of `definition`."""
        shown = await self._request("POST", f"/sessions/{_segment(session_id)}/resume", {"definition": definition})
        return RemoteAgent(self, shown["id"], session_id)

    async def agents(self) -> list[dict[str, Any]]:
        """The agents the caller may see."""
        return await self._request("GET", "/agents")

    async def sessions(self, **filters: Any) -> list[dict[str, Any]]:
        """The caller's sessions, most recent first (`user_id=`, `status=`, `limit=`)."""
        return await self._request("GET", "/sessions", **filters)


class RemoteAgent:
    """An agent of `tiller serve`: the methods of `tiller.Agent`, each one request."""

    def __init__(self, client: Client, id: str, session_id: str) -> None:
        self._client = client
        self.id = id
        self.session_id = session_id

    def __repr__(self) -> str:
        return f"RemoteAgent(id={self.id!r})"

    def _path(self, action: str = "") -> str:
        return f"/agents/{_segment(self.id)}{'/' + action if action else ''}"

    async def prompt(self, text: str) -> None:
        """Starts a run with `text`; raises `tiller.Busy` while a run goes on."""
        await self._client._request("POST", self._path("prompt"), {"text": text})

    async def run(self, text: str) -> RunResult:
        """Runs `text` to the run's end, however long it takes (no read timeout). Cancelled, it aborts the run."""
        try:
            outcome = await self._client._request(
                "POST", self._path("prompt"), {"text": text}, timeout=_NO_READ_TIMEOUT, wait="true"
            )
        except asyncio.CancelledError:
            await asyncio.shield(self.abort())
            raise
        return _result(outcome)

    async def steer(self, text: str) -> None:
        """Redirects the run going on: `text` joins it at its next turn."""
        await self._client._request("POST", self._path("steer"), {"text": text})

    async def follow_up(self, text: str) -> None:
        """Queues `text` for when the run would end."""
        await self._client._request("POST", self._path("follow_up"), {"text": text})

    async def answer(self, request_id: str, text: str) -> None:
        """Answers the question of the waiting call `request_id`."""
        await self._client._request("POST", self._path("reply"), {"type": "answer", "request_id": request_id, "text": text})

    async def approve(self, request_id: str) -> None:
        """Approves the call `request_id`, waiting for approval."""
        await self._client._request("POST", self._path("reply"), {"type": "approve", "request_id": request_id})

    async def deny(self, request_id: str, reason: str | None = None) -> None:
        """Denies the call `request_id`."""
        body = {"type": "deny", "request_id": request_id, **({"reason": reason} if reason is not None else {})}
        await self._client._request("POST", self._path("reply"), body)

    async def reply(self, request_id: str, answer: str | bool) -> None:
        """`True`/`False` approves or denies the call `request_id`; a text answers its question."""
        if answer is True:
            await self.approve(request_id)
        elif answer is False:
            await self.deny(request_id)
        else:
            await self.answer(request_id, answer)

    async def abort(self) -> None:
        """Aborts the run going on."""
        await self._client._request("POST", self._path("abort"))

    async def reset(self) -> None:
        """Aborts any run, then clears the transcript, both queues and the error."""
        await self._client._request("POST", self._path("reset"))

    async def compact(self, instructions: str | None = None) -> dict[str, Any]:
        """Compacts the transcript now: the compaction's report."""
        body = {"instructions": instructions} if instructions is not None else {}
        outcome = await self._client._request(
            "POST", self._path("compact"), body, timeout=_NO_READ_TIMEOUT, wait="true"
        )
        compactions = outcome.get("compactions") or []
        if not compactions:
            raise AgentError("the transcript was not compacted: the compaction did not run", "not_compacted")
        return compactions[-1]

    async def state(self) -> dict[str, Any]:
        """The agent's state, as the server shows it."""
        return await self._client._request("GET", self._path())

    async def delete(self) -> None:
        """Stops the agent and forgets it (its session stays)."""
        await self._client._request("DELETE", self._path())

    def subscribe(self) -> RemoteSubscription:
        """The agent's events from now on."""
        return RemoteSubscription(self._client, self._path("events"))

    async def stream(self, text: str) -> AsyncIterator[Event]:
        """Prompts with `text` and yields the run's events, its `AgentEnd` last."""
        events = self.subscribe()
        try:
            await events.open()
            await self.prompt(text)
            async for event in events:
                yield event
                if isinstance(event, AgentEnd):
                    return
        except asyncio.CancelledError:
            await asyncio.shield(self.abort())
            raise
        finally:
            await events.aclose()


class RemoteSubscription:
    """An agent's server-sent events as event dataclasses. A broken connection is resumed from the last event's
    id (`Last-Event-ID`), so each event arrives once; `max_reconnects` failures in a row raise
    `tiller.Disconnected`."""

    def __init__(self, client: Client, path: str) -> None:
        self._client = client
        self._path = path
        self._last_id: str | None = None
        self._response: httpx.Response | None = None
        self._lines: AsyncIterator[str] | None = None
        self._done = False
        self.reconnects = 0

    async def open(self) -> None:
        """Connects now (else at the first event): events from this moment on are seen."""
        if self._response is None:
            await self._connect()

    async def _connect(self) -> None:
        extra = {"accept": "text/event-stream"}
        if self._last_id is not None:
            extra["last-event-id"] = self._last_id
        # An idle stream is no failure (the server's keep-alives come when it wants): no read timeout.
        request = self._client._http.build_request(
            "GET", self._path, headers=self._client._headers(extra), timeout=_NO_READ_TIMEOUT
        )
        response = await self._client._http.send(request, stream=True)
        if response.status_code >= 400:
            await response.aread()
            await response.aclose()
            raise _problem(response)
        self._response = response
        self._lines = response.aiter_lines()

    async def _drop(self) -> None:
        if self._response is not None:
            await self._response.aclose()
        self._response, self._lines = None, None

    def __aiter__(self) -> RemoteSubscription:
        return self

    async def __anext__(self) -> Event:
        if self._done:
            raise StopAsyncIteration
        failures = 0
        while True:
            try:
                if self._lines is None:
                    await self._connect()
                event = await self._next_event()
            except (httpx.TransportError, httpx.StreamError) as error:
                event, cause = None, error
            except HttpError as error:
                if error.status < 500:  # refused for good (gone, not allowed): no resuming
                    self._done = True
                    raise
                event, cause = None, error  # a server draining or restarting: resumed
            else:
                cause = None
            if event is not None:
                if isinstance(event, AgentStopped):
                    self._done = True
                return event
            # The connection broke or ended: resume from the last event seen.
            await self._drop()
            failures += 1
            if failures > self._client.max_reconnects:
                self._done = True
                raise Disconnected(f"the event stream of {self._path} could not be resumed: {cause}", "disconnected")
            self.reconnects += 1
            await asyncio.sleep(min(0.05 * 2**failures, 2.0))

    async def _next_event(self) -> Event | None:
        """The next event of the open stream; `None` when it ended."""
        assert self._lines is not None
        data: list[str] = []
        event_id: str | None = None
        async for line in self._lines:
            if line == "":
                if data:
                    if event_id is not None:
                        self._last_id = event_id
                    return from_envelope(json.loads("\n".join(data)))
                continue
            if line.startswith(":"):
                continue  # a keep-alive
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "data":
                data.append(value)
            elif name == "id":
                event_id = value
        return None

    async def aclose(self) -> None:
        """Ends the subscription."""
        self._done = True
        await self._drop()


def _segment(value: str) -> str:
    """`value` as one segment of a path (a sub-agent's session id holds `/`)."""
    if value in ("", ".", ".."):
        raise ValueError(f"{value!r} is not an agent or session id")
    return urllib.parse.quote(value, safe="")


def _problem(response: httpx.Response) -> Exception:
    try:
        problem = response.json()
    except ValueError:
        problem = {}
    kind = str(problem.get("type", "")).rsplit(":", 1)[-1] or f"http-{response.status_code}"
    detail = problem.get("detail") or response.reason_phrase
    if kind == "busy":
        return Busy(detail, "busy")
    return HttpError(detail, kind, response.status_code, problem.get("field"))


def _summed(usages: list[dict[str, Any]]) -> dict[str, Any]:
    """Usages added up, field by field (and the cost's too), as the in-process summary has them."""
    total: dict[str, Any] = {}
    for usage in usages:
        for key, value in usage.items():
            if isinstance(value, dict):
                total[key] = _summed([total.get(key, {}), value])
            elif isinstance(value, (int, float)):
                total[key] = total.get(key, 0) + value
    return total


def _result(outcome: dict[str, Any]) -> RunResult:
    """A run's outcome as the server writes it (`?wait=true`), read as `tiller.RunResult`."""
    messages = outcome.get("messages", [])
    last = next((m for m in reversed(messages) if m.get("role") == "assistant"), {})
    text = "".join(part.get("text", "") for part in last.get("content", []) if part.get("type") == "text")
    output = outcome.get("output") or {}
    return RunResult(
        end=outcome.get("end", ""),
        text=text,
        output=output.get("value") if output.get("status") == "valid" else None,
        output_error=output if output.get("status") == "invalid" else None,
        stop_reason=last.get("stop_reason"),
        error=last.get("error_message"),
        usage=_summed([m.get("usage", {}) for m in messages if m.get("role") == "assistant"]),
        tool_calls=[part for part in last.get("content", []) if part.get("type") == "tool_call"],
        messages=messages,
        budget_exceeded=outcome.get("budget_exceeded"),
        guardrail_tripped=outcome.get("guardrail_tripped"),
    )
