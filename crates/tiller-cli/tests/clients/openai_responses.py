"""Tiller's `POST /v1/responses` through the `openai` package, across a
restart of the server.

usage: openai_responses.py BASE_URL start
    a streamed response that starts a session, one that continues it by
    `previous_response_id`; prints the last response's id
usage: openai_responses.py BASE_URL continue ID
    (the server restarted meanwhile, and Node's `openai` continued the
    session once) continues the response ID; prints `ok`"""

import sys

import httpx
import openai

base, phase = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused")

if phase == "start":
    stream = client.responses.create(model="helper", input="hello", stream=True)
    kinds, text, completed = [], "", None
    for event in stream:
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            text += event.delta
        if event.type == "response.completed":
            completed = event.response
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ], kinds
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ], kinds
    assert text.startswith('You said: "hello".'), text
    assert completed.output_text == text, completed
    assert completed.usage.output_tokens > 0, completed.usage
    again = client.responses.create(
        model="helper", input="again", previous_response_id=completed.id
    )
    assert again.status == "completed", again
    assert again.output_text.startswith('You said: "again".'), again.output_text
    print(again.id)
else:
    previous = sys.argv[3]
    raw = client.responses.with_raw_response.create(
        model="helper", input="after a restart", previous_response_id=previous
    )
    response = raw.parse()
    assert response.output_text.startswith('You said: "after a restart".'), response
    session = raw.headers["x-tiller-session"]
    state = httpx.get(f"{base}/agents/{session}").json()
    roles = [message["role"] for message in state["messages"]]
    # hello, again, Node's (after a restart), and this one (after another).
    assert roles == ["user", "assistant"] * 4, roles
    print("ok")
