"""The scripted `faux` model, for tests and demos: each model call takes the next turn pushed."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from . import _native


@dataclass
class FauxTurn:
    """One scripted response: text, thinking and tool calls in order, streamed `chunk_size` characters at a
    time, `delay_ms` apart; `error` makes the call fail with that message."""

    blocks: list[dict[str, Any]] = field(default_factory=list)
    chunk_size: int | None = None
    delay_ms: float | None = None
    error: str | None = None

    @classmethod
    def text(cls, text: str, **options: Any) -> FauxTurn:
        """A turn answering `text`."""
        return cls(**options).with_text(text)

    @classmethod
    def tool_call(cls, name: str, arguments: dict[str, Any], id: str | None = None, **options: Any) -> FauxTurn:
        """A turn calling the tool `name`."""
        return cls(**options).with_tool_call(name, arguments, id)

    def with_text(self, text: str) -> FauxTurn:
        """The same turn, then `text`."""
        self.blocks.append({"text": text})
        return self

    def with_thinking(self, text: str) -> FauxTurn:
        """The same turn, then thinking."""
        self.blocks.append({"thinking": text})
        return self

    def with_tool_call(self, name: str, arguments: dict[str, Any], id: str | None = None) -> FauxTurn:
        """The same turn, then a call of the tool `name` (its id `id`, else a fresh one)."""
        self.blocks.append({"tool_call": {"id": id, "name": name, "arguments": arguments}})
        return self


class Faux:
    """A scripted model: `Faux(FauxTurn.tool_call("add", {...}), FauxTurn.text("3"))`; pass it as `model`."""

    def __init__(self, *turns: FauxTurn | str) -> None:
        self._native = _native.Faux()
        self.push(*turns)

    def push(self, *turns: FauxTurn | str) -> Faux:
        """Queues turns (a text is a turn answering it)."""
        for turn in turns:
            turn = FauxTurn.text(turn) if isinstance(turn, str) else turn
            self._native.push(json.dumps(turn.__dict__))
        return self

    @property
    def remaining(self) -> int:
        """How many pushed turns no call has taken."""
        return self._native.remaining()

    def _model(self) -> Any:
        return self._native.model()
