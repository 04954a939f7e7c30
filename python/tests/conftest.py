"""What the suite shares: events as lines of text (the Rust tests' `describe`), so whole sequences compare exactly."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

import tiller

ROOT = Path(__file__).resolve().parents[2]


def needs(component: str, why: str) -> None:
    """A component this test needs is missing: a failure where every stage is mandatory
    (`TILLER_LIVE=required`, as `.ci/run` sets), else a skip saying so in one line."""
    message = f"{component} is not installed ({why})"
    if os.environ.get("TILLER_LIVE") == "required":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def postgres_url():
    """A throwaway PostgreSQL server (scripts/postgres.sh), or `TILLER_POSTGRES_URL`."""
    if os.environ.get("TILLER_POSTGRES_URL"):
        yield os.environ["TILLER_POSTGRES_URL"]
        return
    script = str(ROOT / "scripts" / "postgres.sh")
    if subprocess.run([script, "installed"]).returncode != 0:
        needs("PostgreSQL", "scripts/postgres.sh install")
    url = subprocess.run(
        [script, "start", "--owner", str(os.getpid())], check=True, capture_output=True, text=True
    ).stdout.strip()
    try:
        yield url
    finally:
        subprocess.run([script, "stop", url], check=False)


def label(message: dict[str, Any]) -> str:
    """A message as the Rust tests label it: `user:TEXT`, `assistant`, `tool_result:ID`."""
    role = message["role"]
    if role == "user":
        content = message["content"]
        text = content if isinstance(content, str) else "".join(c.get("text", "") for c in content)
        return f"user:{text}"
    if role == "tool_result":
        return f"tool_result:{message['tool_call_id']}"
    return role


_STOP = {"stop": "Stop", "tool_use": "ToolUse", "length": "Length", "error": "Error", "aborted": "Aborted"}
_END = {"completed": "Completed", "aborted": "Aborted", "error": "Error", "parked": "Parked"}


def line(event: tiller.Event) -> str:
    """One event's line, as `tiller_test_support::events::describe` writes it."""
    if isinstance(event, (tiller.MessageStart, tiller.MessageEnd)):
        return f"{event.type} {label(event.message)}"
    if isinstance(event, tiller.MessageUpdate):
        return f"message_update {event.assistant_message_event['type']}"
    if isinstance(event, (tiller.ToolExecutionStart, tiller.ToolExecutionEnd)):
        return f"{event.type} {event.tool_call_id}"
    if isinstance(event, tiller.TurnEnd):
        ids = ", ".join(json.dumps(r["tool_call_id"]) for r in event.tool_results)
        return f"turn_end {_STOP[event.message['stop_reason']]} [{ids}]"
    if isinstance(event, tiller.AgentEnd):
        return f"agent_end {_END[event.reason]} {len(event.messages)}"
    if isinstance(event, (tiller.InputRequested, tiller.ApprovalRequested)):
        return f"{event.type} {event.tool_call_id}"
    return event.type


def describe(events: list[tiller.Event]) -> list[str]:
    return [line(event) for event in events]


async def until_end(events: tiller.Subscription) -> list[tiller.Event]:
    """The events up to and with the run's `agent_end`."""
    seen = []
    async for event in events:
        seen.append(event)
        if isinstance(event, tiller.AgentEnd):
            return seen
    raise AssertionError(f"the stream ended without agent_end after {describe(seen)}")


ADDER = """\
type: object
description: Add numbers with the add tool, then say the sums.
json_schema_extra:
  kind: agent
  name: adder
  tools:
    - name: add
      description: Add two integers
      parameters:
        type: object
        properties:
          a: {type: integer}
          b: {type: integer}
        required: [a, b]
      command: [python3, tools/add.py]
"""

ADD_TOOL = """\
import json, sys
args = json.load(sys.stdin)
print(args["a"] + args["b"])
"""


def tiller_binary() -> str:
    """The `tiller` command of this checkout (built by `cargo test`; built here when missing)."""
    binary = os.environ.get("TILLER_BIN") or str(ROOT / "target" / "debug" / "tiller")
    if not os.path.exists(binary):
        subprocess.run(["cargo", "build", "--locked", "-q", "--bin", "tiller"], cwd=ROOT, check=True)
    return binary


class Serving:
    """A `tiller serve` of the `adder` agent, its model the scripted server."""

    def __init__(self, folder: Path, model_url: str, *extra: str, env: dict[str, str] | None = None) -> None:
        agents = folder / "agents"
        (agents / "tools").mkdir(parents=True, exist_ok=True)
        (agents / "adder.yaml").write_text(ADDER)
        (agents / "tools" / "add.py").write_text(ADD_TOOL)
        environment = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and not k.startswith("TILLER_")}
        environment.update({"TILLER_BASE_URL": model_url, "TILLER_MODEL": "scripted"}, **(env or {}))
        self.process = subprocess.Popen(
            [tiller_binary(), "serve", "--listen", "127.0.0.1:0", "--agents", str(agents), *extra],
            stderr=subprocess.PIPE,
            text=True,
            env=environment,
        )
        said = []
        for line in self.process.stderr:
            said.append(line)
            if "serving" in line and "http://" in line:
                self.url = line.split("http://", 1)[1].split()[0].rstrip("/")
                self.url = f"http://{self.url}"
                break
        else:
            raise AssertionError(f"tiller serve did not start: {''.join(said)}")
        # The rest of its log is drained, so that it never blocks on a full pipe.
        import threading

        threading.Thread(target=self.process.stderr.read, daemon=True).start()

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


@pytest.fixture
def scripted_model():
    """The scripted OpenAI-compatible server's base URL."""
    from scripted_openai import start

    server, url = start()
    yield url
    server.shutdown()


@pytest.fixture
def serve(tmp_path, scripted_model):
    """Starts `tiller serve` with the given options (stopped after the test)."""
    started = []

    def start(*extra: str, env: dict[str, str] | None = None) -> Serving:
        serving = Serving(tmp_path / f"serve{len(started)}", scripted_model, *extra, env=env)
        started.append(serving)
        return serving

    yield start
    for serving in started:
        serving.stop()
