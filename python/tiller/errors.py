"""Tiller's exceptions: what the runtime refuses, and what a tool raises to say how it ended."""

from __future__ import annotations


class TillerError(Exception):
    """Anything Tiller refuses. `kind` names the reason, as Rust's error variant does (snake case)."""

    def __init__(self, message: str, kind: str = "error") -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind

    def __str__(self) -> str:
        return self.message


class AgentError(TillerError):
    """An agent refused an operation (`kind`: `cannot_start`, `no_model`, `stopped`, `store`, `queue_full`, ...)."""


class Busy(AgentError):
    """A prompt while a run is going on: `steer()` redirects the run, `follow_up()` queues work for after it."""


class SpawnError(TillerError):
    """The supervisor could not spawn or resume an agent (`kind`: `id_taken`, `not_owner`, `missing_tools`, ...)."""


class ConfigError(TillerError):
    """Settings that cannot make an agent: a model, an agent file, a store URL, a tool (`kind` says which)."""


class ToolError(Exception):
    """Raised in a tool: the call ends in an error result with this message, and the run goes on."""


class NeedsInput(Exception):
    """Raised in a tool: the run parks until the user answers `question`; the tool then runs again with the
    answer in its argument `field` (and `ctx.answered` true)."""

    def __init__(self, field: str, question: str) -> None:
        super().__init__(f"needs `{field}`: {question}")
        self.field = field
        self.question = question


class NeedsApproval(Exception):
    """Raised in a tool: the run parks until the user approves or denies the call; approved, the tool runs
    again with `ctx.approved` true."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class HttpError(TillerError):
    """`tiller serve` refused a request: its problem's `kind` (`not-found`, `invalid`, `unauthorized`,
    `quota-exceeded`, ...), the HTTP `status` and the request `field` at fault, if one is."""

    def __init__(self, message: str, kind: str = "error", status: int = 0, field: str | None = None) -> None:
        super().__init__(message, kind)
        self.status = status
        self.field = field


class Disconnected(TillerError):
    """An event stream from `tiller serve` could not be resumed: the server stayed unreachable through every
    reconnection (`kind` is `disconnected`)."""
