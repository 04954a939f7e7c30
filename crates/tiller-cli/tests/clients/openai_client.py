"""Tiller's OpenAI-compatible endpoints through the `openai` package, as its
users call them: the model list, a completion that starts a session, a streamed
one that continues it, and an error for a model no definition has.

Then the README's snippet (under "From any client"), as written there but for
the server's address. Usage: openai_client.py BASE_URL README; prints `ok`."""

import contextlib
import io
import sys

import httpx
import openai

base = sys.argv[1]
client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused")

models = [model.id for model in client.models.list()]
assert "helper" in models, models

raw = client.chat.completions.with_raw_response.create(
    model="helper",
    messages=[
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hello"},
    ],
)
session = raw.headers["x-tiller-session"]
completion = raw.parse()
choice = completion.choices[0]
assert choice.message.content.startswith('You said: "hello".'), completion
assert choice.finish_reason == "stop", completion
assert completion.usage.completion_tokens > 0, completion

stream = client.chat.completions.create(
    model="helper",
    messages=[{"role": "user", "content": "again"}],
    stream=True,
    stream_options={"include_usage": True},
    extra_headers={"X-Tiller-Session": session},
)
pieces, finishes, usage = [], [], None
for chunk in stream:
    usage = chunk.usage or usage
    for choice in chunk.choices:
        pieces.append(choice.delta.content or "")
        if choice.finish_reason:
            finishes.append(choice.finish_reason)
text = "".join(pieces)
assert text.startswith('You said: "again".'), text
assert len(pieces) > 2, pieces
assert finishes == ["stop"], finishes
assert usage is not None and usage.completion_tokens > 0, usage

# The session holds both exchanges, in order.
state = httpx.get(f"{base}/agents/{session}").json()
roles = [message["role"] for message in state["messages"]]
assert roles == ["user", "assistant", "user", "assistant"], roles

try:
    client.chat.completions.create(
        model="nobody", messages=[{"role": "user", "content": "hi"}]
    )
    raise AssertionError("a model no definition has was answered")
except openai.APIStatusError as error:
    assert error.status_code == 404, error
    assert "nobody" in error.message, error.message

with open(sys.argv[2], encoding="utf-8") as file:
    section = file.read().split("### From any client")[1]
snippet = section.split("```python\n")[1].split("```")[0]
printed = io.StringIO()
with contextlib.redirect_stdout(printed):
    exec(snippet.replace("http://127.0.0.1:8787", base), {})
lines = printed.getvalue().splitlines()
assert len(lines) == 2 and all(line.strip() for line in lines), lines

print("ok")
