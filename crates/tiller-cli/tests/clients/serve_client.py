"""A user of `tiller serve` in Python, with `httpx` and the `httpx-sse` client: it
creates an agent, follows its events while prompting it, resumes the stream with
Last-Event-ID, reads problem+json errors, waits for a run's outcome, and deletes the
agent; the answer is rebuilt from the lean stream, whole and after resuming in its
middle, by the README's `rebuild` (taken from README.md as written there). Run by
crates/tiller-cli/tests/serve.rs as `python serve_client.py BASE_URL README`; any
mismatch fails with a message and exit status 1."""

import json
import sys

import httpx
from httpx_sse import connect_sse


def expect(condition, message):
    if not condition:
        print(f"serve_client.py: {message}", file=sys.stderr)
        sys.exit(1)


def follow(http, headers=None):
    """The events of the agent `py` up to the next agent_end."""
    events = []
    with connect_sse(http, "GET", "/agents/py/events", headers=headers or {}) as source:
        expect(source.response.status_code == 200, f"events: {source.response.status_code}")
        for sse in source.iter_sse():
            events.append(sse)
            if sse.event == "agent_end":
                return events
    expect(False, "the event stream ended before agent_end")


def readme_rebuild(readme):
    """The README's rebuild rule in Python, as written there."""
    with open(readme, encoding="utf-8") as file:
        section = file.read().split("### Rebuilding a message")[1]
    code = section.split("```python\n")[1].split("```")[0]
    scope = {}
    exec(code, scope)
    return scope["rebuild"]


def rebuilt(rebuild, envelopes):
    """The assistant message each update of `envelopes` leaves, the last one."""
    message = None
    for envelope in envelopes:
        message = rebuild(message, envelope["event"])
    return message


def main(base, readme):
    rebuild = readme_rebuild(readme)
    with httpx.Client(base_url=base, timeout=30) as http:
        created = http.post("/agents", json={"definition": "helper", "id": "py"})
        expect(created.status_code == 201, f"create: {created.status_code} {created.text}")
        expect(created.json() == {"id": "py", "name": None, "status": "idle"}, created.text)

        # The stream is open before the prompt, so it sees the whole run.
        with connect_sse(http, "GET", "/agents/py/events") as source:
            prompted = http.post("/agents/py/prompt", json={"text": "hello from Python"})
            expect(prompted.status_code == 202, f"prompt: {prompted.status_code} {prompted.text}")
            events = []
            for sse in source.iter_sse():
                events.append(sse)
                if sse.event == "agent_end":
                    break
        kinds = [event.event for event in events]
        expect(
            kinds[:5] == ["agent_start", "turn_start", "message_start", "message_end", "message_start"]
            and kinds[-3:] == ["message_end", "turn_end", "agent_end"]
            and set(kinds[5:-3]) == {"message_update"},
            f"event order: {kinds}",
        )
        ids = [int(event.id) for event in events]
        expect(ids == list(range(ids[0], ids[0] + len(ids))), f"ids: {ids}")
        envelopes = [json.loads(event.data) for event in events]
        expect(all(e["seq"] == i and e["agent_id"] == "py" for e, i in zip(envelopes, ids)), "envelopes")
        text = "".join(
            e["event"]["assistant_message_event"].get("delta", "")
            for e in envelopes
            if e["event"]["type"] == "message_update"
            and e["event"]["assistant_message_event"]["type"] == "text_delta"
        )
        expect(text.startswith('You said: "hello from Python".'), f"streamed text: {text!r}")

        # Each update is a piece; the rule rebuilds the answer message_end brings.
        expect(all("message" not in e["event"] for e in envelopes[5:-3]), "updates are lean")
        answer = envelopes[-3]["event"]["message"]["content"]
        expect(rebuilt(rebuild, envelopes[:-3])["content"] == answer, "the rebuilt answer differs")

        # Back after the assistant's first piece: the rest, each event once, its
        # first update a snapshot of the answer so far, from which it rebuilds.
        resumed = follow(http, {"Last-Event-ID": events[5].id})
        expect(
            [(e.id, e.event) for e in resumed] == [(e.id, e.event) for e in events[6:]]
            and [e.data for e in resumed[1:]] == [e.data for e in events[7:]],
            "the resumed stream differs from what was missed",
        )
        snapshot = json.loads(resumed[0].data)
        expect("message" in snapshot["event"], "a resumed update in the middle is a snapshot")
        again = [json.loads(e.data) for e in resumed]
        expect(rebuilt(rebuild, again[:-3])["content"] == answer, "the answer rebuilt after resuming differs")

        # Errors are problem+json and name what is wrong.
        missing = http.post("/agents/ghost/prompt", json={"text": "hi"})
        expect(missing.status_code == 404, f"unknown agent: {missing.status_code}")
        expect(missing.headers["content-type"] == "application/problem+json", missing.headers["content-type"])
        expect(missing.json()["type"] == "urn:tiller:problem:unknown-agent", missing.text)
        bad = http.post("/agents/py/prompt", json={"txt": "hi"})
        expect(bad.status_code == 422 and bad.json()["field"] == "txt", f"bad field: {bad.text}")

        # ?wait=true answers with the run's outcome.
        waited = http.post("/agents/py/prompt", params={"wait": "true"}, json={"text": "again"})
        expect(waited.status_code == 200, f"wait: {waited.status_code} {waited.text}")
        outcome = waited.json()
        expect(outcome["end"] == "completed" and len(outcome["messages"]) == 2, waited.text)

        state = http.get("/agents/py").json()
        expect(len(state["messages"]) == 4 and state["status"] == "idle", json.dumps(state)[:300])

        # The conversation, from the store, a page at a time.
        sessions = http.get("/sessions").json()
        expect([(s["id"], s["messages"]) for s in sessions] == [("py", 4)], json.dumps(sessions)[:300])
        first = http.get("/sessions/py/messages", params={"limit": 3}).json()
        rest = http.get("/sessions/py/messages", params={"from": first["next"], "limit": 3}).json()
        expect((first["next"], rest["next"]) == (3, None), f"pages: {first['next']}, {rest['next']}")
        expect(first["messages"] + rest["messages"] == state["messages"], "the pages differ from the transcript")

        expect(http.delete("/agents/py").status_code == 204, "delete")
        expect(http.get("/agents/py").status_code == 404, "deleted agent still there")
        # The session outlives its agent, and is resumed with its transcript.
        resumed = http.post("/sessions/py/resume", json={"definition": "helper"})
        expect(resumed.status_code == 201 and resumed.json()["id"] == "py", f"resume: {resumed.text}")
        expect(len(http.get("/agents/py").json()["messages"]) == 4, "the resumed transcript")
        expect(http.delete("/sessions/py").status_code == 204, "delete the session")
        expect(http.get("/sessions").json() == [], "the session is still listed")
    print("ok")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
