"""A scripted OpenAI-compatible server (chat completions, streamed or not), for the tests and the benches: every
framework under test talks to it as to OpenAI.

The script: a user message that asks to add gets three `add` calls in one response (1+2, 3+4, 5+6); the tools'
results get "The sums are 3, 7 and 11."; any other user message gets "You said: TEXT". A streamed answer comes
in pieces of `PIECE` characters, `--spacing-ms` apart.

    python scripted_openai.py [--spacing-ms N]   # prints its base URL, then serves until killed
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PIECE = 4
SUMS = [(1, 2), (3, 4), (5, 6)]


def answer(messages: list[dict]) -> tuple[str, list[dict]]:
    """The script's text and tool calls for a conversation."""
    last = messages[-1]
    if last["role"] == "tool":
        return "The sums are 3, 7 and 11.", []
    content = last.get("content") or ""
    text = content if isinstance(content, str) else "".join(part.get("text", "") for part in content)
    if "add" in text.lower():
        calls = [
            {"id": f"call_{n}", "type": "function", "function": {"name": "add", "arguments": json.dumps({"a": a, "b": b})}}
            for n, (a, b) in enumerate(SUMS, 1)
        ]
        return "", calls
    return f"You said: {text}", []


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    spacing = 0.0

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        body = json.dumps({"object": "list", "data": [{"id": "scripted", "object": "model", "owned_by": "tests"}]}).encode()
        self._send(200, "application/json", body)

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
        text, calls = answer(request["messages"])
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        if not request.get("stream"):
            message = {"role": "assistant", "content": text or None}
            if calls:
                message["tool_calls"] = calls
            body = {
                "id": "chatcmpl-scripted", "object": "chat.completion", "created": int(time.time()), "model": "scripted",
                "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
                "usage": usage,
            }
            self._send(200, "application/json", json.dumps(body).encode())
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()
        base = {"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "created": int(time.time()), "model": "scripted"}

        def chunk(delta: dict, finish: str | None = None, **extra) -> None:
            payload = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}
            self.wfile.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
            self.wfile.flush()
            if self.spacing:
                time.sleep(self.spacing)

        chunk({"role": "assistant", "content": ""})
        for at in range(0, len(text), PIECE):
            chunk({"content": text[at : at + PIECE]})
        for n, call in enumerate(calls):
            chunk({"tool_calls": [{"index": n, **call}]})
        chunk({}, "tool_calls" if calls else "stop")
        payload = {**base, "choices": [], "usage": usage}
        self.wfile.write(b"data: " + json.dumps(payload).encode() + b"\n\ndata: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True

    def _send(self, status: int, kind: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        # A client that hangs up mid-answer (an aborted run) is no error of the script.
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


def start(spacing_ms: float = 0.0) -> tuple[ThreadingHTTPServer, str]:
    """Serves on a free loopback port from a thread of this process: the server and its base URL (`.../v1`)."""
    handler = type("ScriptedHandler", (Handler,), {"spacing": spacing_ms / 1000})
    server = Server(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/v1"


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--spacing-ms", type=float, default=0.0)
    options = parser.parse_args()
    server, url = start(options.spacing_ms)
    print(url, flush=True)
    try:
        sys.stdin.read()  # until the parent closes our stdin (or kills us)
    finally:
        server.shutdown()
