"""Every event of `tiller serve`'s AG-UI route validated by the `ag-ui-protocol`
package's own event models.

usage: ag_ui_events.py BASE_URL DEFINITION; prints the events' types (JSON)"""

import json
import sys

import httpx
from ag_ui.core import Event, RunAgentInput, UserMessage
from pydantic import TypeAdapter

base, definition = sys.argv[1], sys.argv[2]
events = TypeAdapter(Event)
run = RunAgentInput(
    thread_id="thread-py",
    run_id="run-1",
    state={},
    messages=[UserMessage(id="u1", role="user", content="What does cat say?")],
    tools=[],
    context=[],
    forwarded_props={},
)
body = run.model_dump(mode="json", by_alias=True, exclude_none=True)
kinds = []
with httpx.stream("POST", f"{base}/ag-ui/{definition}", json=body, timeout=30) as response:
    assert response.status_code == 200, response.read()
    for line in response.iter_lines():
        if line.startswith("data: "):
            kinds.append(events.validate_json(line[len("data: "):]).type.value)
print(json.dumps(kinds))
