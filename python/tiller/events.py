"""An agent's events as dataclasses, one per type of Tiller's event contract (pi-agent-core's names).

Events arrive in the lean wire form: a `MessageUpdate` carries its piece (`assistant_message_event`), not the
message as it stands; `message_end` brings the finished message. Messages and results are plain dicts, as their
JSON is. Every event has `type` (the wire's name), `seq` (the agent's sequence number) and `agent_id`.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

__all__ = [
    "Event",
    "AgentStart",
    "TurnStart",
    "MessageStart",
    "MessageUpdate",
    "MessageEnd",
    "ToolExecutionStart",
    "ToolExecutionUpdate",
    "Action",
    "ToolExecutionEnd",
    "InputRequested",
    "ApprovalRequested",
    "ChildEvent",
    "CompactionStart",
    "CompactionEnd",
    "TurnEnd",
    "RateLimited",
    "ModelFallback",
    "BudgetExceeded",
    "GuardrailTripped",
    "AgentEnd",
    "Lagged",
    "AgentRestarted",
    "AgentStopped",
    "OwnerChanged",
    "TurnRestarted",
    "UnknownEvent",
    "event_from",
    "from_envelope",
    "parse_batch",
]


@dataclass(kw_only=True)
class Event:
    """What every event carries."""

    type: ClassVar[str] = "event"
    seq: int = 0
    agent_id: str = ""


@dataclass(kw_only=True)
class AgentStart(Event):
    """A run began."""

    type: ClassVar[str] = "agent_start"


@dataclass(kw_only=True)
class TurnStart(Event):
    """A turn (one model response and its tool calls) began."""

    type: ClassVar[str] = "turn_start"


@dataclass(kw_only=True)
class MessageStart(Event):
    """A message (the user's, the assistant's as it starts streaming, a tool's result) joins the transcript."""

    type: ClassVar[str] = "message_start"
    message: dict[str, Any] = field(default_factory=dict)


@dataclass(kw_only=True)
class MessageUpdate(Event):
    """A piece of the assistant's streaming answer: `assistant_message_event` is `text_delta`,
    `thinking_delta`, `tool_call_start`, ... `message` is set only on a snapshot (a reader that could not
    rebuild)."""

    type: ClassVar[str] = "message_update"
    assistant_message_event: dict[str, Any] = field(default_factory=dict)
    message: dict[str, Any] | None = None

    @property
    def delta(self) -> str | None:
        """The text this update adds to the answer, if it is a `text_delta`."""
        piece = self.assistant_message_event
        return piece.get("delta") if piece.get("type") == "text_delta" else None


@dataclass(kw_only=True)
class MessageEnd(Event):
    """A message is finished; `message` is the whole of it."""

    type: ClassVar[str] = "message_end"
    message: dict[str, Any] = field(default_factory=dict)


@dataclass(kw_only=True)
class ToolExecutionStart(Event):
    """A tool call starts, with its validated arguments."""

    type: ClassVar[str] = "tool_execution_start"
    tool_call_id: str = ""
    tool_name: str = ""
    label: str | None = None
    args: Any = None


@dataclass(kw_only=True)
class ToolExecutionUpdate(Event):
    """A running tool's progress."""

    type: ClassVar[str] = "tool_execution_update"
    tool_call_id: str = ""
    tool_name: str = ""
    partial_result: dict[str, Any] = field(default_factory=dict)
    args: Any = None


@dataclass(kw_only=True)
class Action(Event):
    """Something a tool asks the interface to do (show a widget, say)."""

    type: ClassVar[str] = "action"
    tool_call_id: str = ""
    action_type: str = ""
    payload: Any = None


@dataclass(kw_only=True)
class ToolExecutionEnd(Event):
    """A tool call ended: its result, and whether it is an error."""

    type: ClassVar[str] = "tool_execution_end"
    tool_call_id: str = ""
    tool_name: str = ""
    result: dict[str, Any] = field(default_factory=dict)
    is_error: bool = False


@dataclass(kw_only=True)
class InputRequested(Event):
    """A call asks the user for `field`; answer with `agent.answer(tool_call_id, text)`."""

    type: ClassVar[str] = "input_requested"
    tool_call_id: str = ""
    tool_name: str = ""
    field: str = ""
    question: str = ""
    current_data: Any = None


@dataclass(kw_only=True)
class ApprovalRequested(Event):
    """A call waits for approval; `agent.approve(tool_call_id)` or `agent.deny(tool_call_id, reason)`."""

    type: ClassVar[str] = "approval_requested"
    tool_call_id: str = ""
    tool_name: str = ""
    args: Any = None
    reason: str | None = None


@dataclass(kw_only=True)
class ChildEvent(Event):
    """An event of an agent this one asked (through a tool), at `path`."""

    type: ClassVar[str] = "child_event"
    path: list[str] = field(default_factory=list)
    tool_call_id: str = ""
    event: Event | None = None


@dataclass(kw_only=True)
class CompactionStart(Event):
    """A compaction of the transcript began."""

    type: ClassVar[str] = "compaction_start"
    reason: Any = None
    tokens_before: int = 0


@dataclass(kw_only=True)
class CompactionEnd(Event):
    """A compaction ended: the summary that replaced the oldest messages, or its error."""

    type: ClassVar[str] = "compaction_end"
    reason: Any = None
    tokens_before: int = 0
    tokens_after: int = 0
    summary_id: int | None = None
    summary: dict[str, Any] | None = None
    kept: int = 0
    error: str | None = None


@dataclass(kw_only=True)
class TurnEnd(Event):
    """A turn ended: the assistant's message and its tool results."""

    type: ClassVar[str] = "turn_end"
    message: dict[str, Any] = field(default_factory=dict)
    tool_results: list[dict[str, Any]] = field(default_factory=list)


@dataclass(kw_only=True)
class RateLimited(Event):
    """A model call waits for its account's rate limit."""

    type: ClassVar[str] = "rate_limited"
    account: str = ""
    wait_ms: int = 0
    cause: Any = None


@dataclass(kw_only=True)
class ModelFallback(Event):
    """A model failed and the next fallback takes over (`from_` is the wire's `from`)."""

    type: ClassVar[str] = "model_fallback"
    from_: str = ""
    to: str = ""
    error: str = ""


@dataclass(kw_only=True)
class BudgetExceeded(Event):
    """A budget ran out and ends the run."""

    type: ClassVar[str] = "budget_exceeded"
    scope: Any = None
    limit: Any = None
    max: Any = None
    spent: Any = None


@dataclass(kw_only=True)
class GuardrailTripped(Event):
    """A guardrail tripped and ends the run."""

    type: ClassVar[str] = "guardrail_tripped"
    stage: Any = None
    guardrail: str = ""
    reason: str = ""


@dataclass(kw_only=True)
class AgentEnd(Event):
    """A run ended: its own messages, why it ended (`completed`, `aborted`, `error`, `parked`, ...) and its
    structured output, if any."""

    type: ClassVar[str] = "agent_end"
    messages: list[dict[str, Any]] = field(default_factory=list)
    reason: str = ""
    output: Any = None


@dataclass(kw_only=True)
class Lagged(Event):
    """This reader fell behind and missed `missed` events from `seq` on."""

    type: ClassVar[str] = "lagged"
    missed: int = 0


@dataclass(kw_only=True)
class AgentRestarted(Event):
    """The agent failed and was restarted from its last finished message."""

    type: ClassVar[str] = "agent_restarted"
    reason: str = ""


@dataclass(kw_only=True)
class AgentStopped(Event):
    """The agent stopped; no more events come."""

    type: ClassVar[str] = "agent_stopped"
    reason: str = ""


@dataclass(kw_only=True)
class OwnerChanged(Event):
    """Another host of a cluster took the agent over."""

    type: ClassVar[str] = "owner_changed"
    host: str = ""
    epoch: int = 0


@dataclass(kw_only=True)
class TurnRestarted(Event):
    """The turn going on starts again (its host changed mid-turn)."""

    type: ClassVar[str] = "turn_restarted"


@dataclass(kw_only=True)
class UnknownEvent(Event):
    """An event of a type this package does not know (a newer Tiller): its name and fields."""

    type_name: str = ""
    data: dict[str, Any] = field(default_factory=dict)


_TYPES: dict[str, type[Event]] = {
    cls.type: cls
    for cls in (
        AgentStart, TurnStart, MessageStart, MessageUpdate, MessageEnd, ToolExecutionStart,
        ToolExecutionUpdate, Action, ToolExecutionEnd, InputRequested, ApprovalRequested, ChildEvent,
        CompactionStart, CompactionEnd, TurnEnd, RateLimited, ModelFallback, BudgetExceeded,
        GuardrailTripped, AgentEnd, Lagged, AgentRestarted, AgentStopped, OwnerChanged, TurnRestarted,
    )
}
_FIELDS: dict[type[Event], frozenset[str]] = {
    cls: frozenset(f.name for f in dataclasses.fields(cls)) for cls in _TYPES.values()
}


def event_from(data: dict[str, Any], seq: int = 0, agent_id: str = "") -> Event:
    """The event `data` (an event's JSON object) is; fields this package does not know are left out."""
    name = data.get("type", "")
    cls = _TYPES.get(name)
    if cls is None:
        return UnknownEvent(seq=seq, agent_id=agent_id, type_name=name, data=data)
    known = _FIELDS[cls]
    fields = {key: value for key, value in data.items() if key in known}
    if cls is ModelFallback and "from" in data:
        fields["from_"] = data["from"]
    if cls is ChildEvent and isinstance(data.get("event"), dict):
        fields["event"] = event_from(data["event"], seq, agent_id)
    return cls(seq=seq, agent_id=agent_id, **fields)


def from_envelope(envelope: dict[str, Any]) -> Event:
    """The event of one envelope of the lean wire (`{"agent_id", "seq", "event"}`)."""
    return event_from(envelope["event"], envelope.get("seq", 0), envelope.get("agent_id", ""))


def parse_batch(batch: bytes) -> list[Event]:
    """The events of a batch: a JSON array of envelopes."""
    return [from_envelope(envelope) for envelope in json.loads(batch)]
