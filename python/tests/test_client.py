"""`tiller.Client` against a real `tiller serve`: the same events as in-process, typed refusals, tokens and
JWTs, and a stream resumed with `Last-Event-ID` after its connection is cut."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import time

import pytest

import tiller
from conftest import ADD_TOOL, ADDER, Serving, describe, until_end
from scripted_openai import start as scripted


def _without_tool_ends(lines: list[str]) -> list[str]:
    # Three parallel command tools end in any order; everything else is fixed.
    return [line for line in lines if not line.startswith("tool_execution_end")]


async def _through_client(url: str, **options) -> list[tiller.Event]:
    async with tiller.Client(url, **options) as client:
        agent = await client.spawn("adder")
        return [event async for event in agent.stream("Please add these.")]


async def _in_process(folder, model_url: str) -> list[tiller.Event]:
    (folder / "tools").mkdir(parents=True)
    (folder / "adder.yaml").write_text(ADDER)
    (folder / "tools" / "add.py").write_text(ADD_TOOL)
    async with await tiller.Supervisor.start() as supervisor:
        model = tiller.Model.openai_compatible(model_url, "scripted")
        agent = await supervisor.spawn(file=folder / "adder.yaml", model=model)
        return [event async for event in agent.stream("Please add these.")]


def test_the_client_sees_the_events_an_in_process_agent_gives(serve, scripted_model, tmp_path):
    serving = serve()
    remote = asyncio.run(_through_client(serving.url))
    local = asyncio.run(_in_process(tmp_path / "local", scripted_model))
    assert _without_tool_ends(describe(remote)) == _without_tool_ends(describe(local))
    assert describe(remote)[-1] == "agent_end Completed 6"
    ends = sorted((e.tool_call_id, e.result["content"][0]["text"].strip()) for e in remote if isinstance(e, tiller.ToolExecutionEnd))
    assert ends == [("call_1", "3"), ("call_2", "7"), ("call_3", "11")]
    answer = [e for e in remote if isinstance(e, tiller.MessageUpdate) and e.delta]
    assert "".join(e.delta for e in answer) == "The sums are 3, 7 and 11."


def test_the_client_runs_steers_and_is_refused_in_types(tmp_path):
    model, model_url = scripted(spacing_ms=100)
    serving = Serving(tmp_path, model_url)
    try:

        async def main():
            async with tiller.Client(serving.url) as client:
                agent = await client.spawn("adder", id="calc-1")
                assert (agent.id, agent.session_id) == ("calc-1", "calc-1")
                await agent.prompt("Hello there")
                with pytest.raises(tiller.Busy) as busy:
                    await agent.prompt("And again")
                assert busy.value.kind == "busy"
                await agent.abort()
                events = agent.subscribe()
                await events.open()
                result = await agent.run("Hello")
                assert (result.end, result.text) == ("completed", "You said: Hello")
                seen = await until_end(events)
                assert describe(seen)[-1] == "agent_end Completed 2"
                await events.aclose()
                state = await agent.state()
                assert state["messages"][-1]["content"][0]["text"] == "You said: Hello"
                with pytest.raises(tiller.HttpError) as unknown:
                    await client.agent("nobody").prompt("hi")
                assert (unknown.value.status, unknown.value.kind) == (404, "unknown-agent")
                with pytest.raises(tiller.HttpError) as invalid:
                    await client.spawn("adder", id="a/b")
                assert (invalid.value.status, invalid.value.field) == (422, "id")

        asyncio.run(main())
    finally:
        serving.stop()
        model.shutdown()


def _jwt(secret: str, claims: dict) -> str:
    """An HS256 JSON Web Token, as an identity provider signs one."""
    def encode(value: bytes) -> str:
        return base64.urlsafe_b64encode(value).rstrip(b"=").decode()

    head = encode(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = encode(json.dumps(claims).encode())
    signature = hmac.new(secret.encode(), f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{encode(signature)}"


def test_tokens_and_json_web_tokens(serve, tmp_path):
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text("tokens:\n  - {token: secret-acme, tenant: acme}\n")
    serving = serve("--tokens", str(tokens), "--jwt-secret-env", "TEST_JWT_SECRET", env={"TEST_JWT_SECRET": "s3cret"})

    async def main():
        with pytest.raises(tiller.HttpError) as anonymous:
            async with tiller.Client(serving.url) as client:
                await client.spawn("adder")
        assert anonymous.value.status == 401
        async with tiller.Client(serving.url, token="secret-acme") as client:
            agent = await client.spawn("adder")
            assert (await agent.run("Hi")).text == "You said: Hi"
        # A function gives the token for each request: a JWT renewed as it expires.
        minted = []

        def fresh_jwt() -> str:
            minted.append(1)
            return _jwt("s3cret", {"sub": "u-1", "tenant_id": "beta", "exp": int(time.time()) + 60})

        async with tiller.Client(serving.url, token=fresh_jwt) as client:
            agent = await client.spawn("adder")
            assert (await agent.run("Hi")).text == "You said: Hi"
            assert [s["id"] for s in await client.sessions()] == [agent.session_id]
        assert len(minted) == 3
        forged = _jwt("wrong", {"sub": "u-1", "exp": int(time.time()) + 60})
        with pytest.raises(tiller.HttpError) as refused:
            async with tiller.Client(serving.url, token=forged) as client:
                await client.spawn("adder")
        assert refused.value.status == 401

    asyncio.run(main())


class CuttingProxy:
    """A TCP proxy in front of the server whose open connections can be cut: the network failing mid-stream."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.writers: list[asyncio.StreamWriter] = []

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self.writers += [writer, upstream_writer]

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                sink.close()

        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))

    def cut(self) -> None:
        for writer in self.writers:
            writer.transport.abort()
        self.writers.clear()


def test_a_cut_stream_resumes_from_its_last_event_once_each(tmp_path):
    model, model_url = scripted(spacing_ms=20)
    serving = Serving(tmp_path, model_url)
    try:

        async def main():
            proxy = CuttingProxy(int(serving.url.rsplit(":", 1)[1]))
            url = await proxy.start()
            async with tiller.Client(url) as client:
                agent = await client.spawn("adder")
                events = agent.subscribe()
                await events.open()
                await agent.prompt("Please add these.")
                seen = []
                async for event in events:
                    seen.append(event)
                    if isinstance(event, tiller.ToolExecutionStart) and event.tool_call_id == "call_1":
                        proxy.cut()
                    if isinstance(event, tiller.AgentEnd):
                        break
                await events.aclose()
                proxy.server.close()
                return seen, events.reconnects

        seen, reconnects = asyncio.run(main())
        assert reconnects >= 1
        # Every event once, none missed: their numbers follow on.
        assert [e.seq for e in seen] == list(range(seen[0].seq, seen[0].seq + len(seen)))
        assert describe(seen)[-1] == "agent_end Completed 6"
        assert "".join(e.delta for e in seen if isinstance(e, tiller.MessageUpdate) and e.delta) == "The sums are 3, 7 and 11."
    finally:
        serving.stop()
        model.shutdown()
