#!/usr/bin/env python3
"""Seeds corpus/ from the recorded provider exchanges (fixtures/cassettes, a copy of
../shared/fixtures) and the example agent files. Run from anywhere; rewrites corpus/."""
import base64, glob, json, os, shutil

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.join(here, "..", "..")
corpus = os.path.join(here, "corpus")
shutil.rmtree(corpus, ignore_errors=True)
MAX = 16 * 1024

def write(target, name, data):
    folder = os.path.join(corpus, target)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)

seen = set()
schemas = set()
for path in sorted(glob.glob(os.path.join(root, "fixtures", "cassettes", "*", "*.json"))):
    dialect = os.path.basename(os.path.dirname(path))
    stem = os.path.splitext(os.path.basename(path))[0][:60]
    for i, exchange in enumerate(json.load(open(path))["exchanges"]):
        target = {"anthropic": "anthropic_sse", "gemini": "gemini_sse",
                  "bedrock": "bedrock_eventstream"}.get(dialect, "openai_sse")
        if exchange["request"]["path"].endswith("/responses"):
            target = "openai_responses_sse"
        body = exchange["response"]["body"]
        if exchange["response"].get("body_encoding") == "base64":
            body = base64.b64decode(body)
        if 0 < len(body) <= MAX and body not in seen:
            seen.add(body)
            write(target, f"{stem}-{i}", body)
        request = exchange["request"]["body"]
        tools = request.get("tools") or (request.get("toolConfig") or {}).get("tools") or []
        # Gemini declares its functions inside one tools entry.
        tools = [d for t in tools for d in (t.get("functionDeclarations") or [])] + \
                [t for t in tools if "functionDeclarations" not in t and "codeExecution" not in t]
        for tool in tools:
            schema = (tool.get("function", {}).get("parameters") or tool.get("input_schema")
                      or tool.get("parameters")
                      or tool.get("toolSpec", {}).get("inputSchema", {}).get("json"))
            if schema and json.dumps(schema, sort_keys=True) not in schemas:
                schemas.add(json.dumps(schema, sort_keys=True))
                name = tool.get("function", tool.get("toolSpec", tool)).get("name")
                write("tool_args", f"{stem}-{i}-{name}",
                      json.dumps(schema) + "\n" + json.dumps({"value": "red", "n": 3}))
        for message in request.get("messages", []):
            for call in message.get("tool_calls") or []:
                write("partial_json", f"{stem}-{i}-{call['id'][-8:]}", call["function"]["arguments"])
            if isinstance(message.get("content"), list):
                for block in message["content"]:
                    if block.get("type") == "tool_use":
                        write("partial_json", f"{stem}-{i}-{block['id'][-8:]}", json.dumps(block["input"]))

for path in sorted(glob.glob(os.path.join(root, "examples", "agents", "*.yaml"))):
    write("agent_file", os.path.basename(path), open(path).read())
readme = open(os.path.join(root, "README.md")).read()
start = readme.index("```yaml\ntype: object") + len("```yaml\n")
write("agent_file", "readme.yaml", readme[start:readme.index("```", start)])
write("agent_file", "minimal.json", json.dumps({
    "type": "object", "description": "x",
    "json_schema_extra": {"kind": "agent", "name": "a", "max_turns": 3,
                          "tools": [{"name": "t", "description": "d", "command": ["echo"], "env": ["A"]}]}}))
# pi's proxy events (what `tiller serve`'s /api/stream writes), for the proxy provider.
usage = {"input": 3, "output": 4, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 7,
         "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "total": 0}}
proxy_replies = {
    "text": [{"type": "start"}, {"type": "text_start", "contentIndex": 0},
             {"type": "text_delta", "contentIndex": 0, "delta": "It is "},
             {"type": "text_delta", "contentIndex": 0, "delta": "noon."},
             {"type": "text_end", "contentIndex": 0}, {"type": "done", "reason": "stop", "usage": usage}],
    "thinking_and_tool": [{"type": "start"}, {"type": "thinking_start", "contentIndex": 0},
             {"type": "thinking_delta", "contentIndex": 0, "delta": "hm"},
             {"type": "thinking_end", "contentIndex": 0, "contentSignature": "sig"},
             {"type": "toolcall_start", "contentIndex": 1, "id": "c1", "toolName": "clock"},
             {"type": "toolcall_delta", "contentIndex": 1, "delta": "{\"zone\":"},
             {"type": "toolcall_delta", "contentIndex": 1, "delta": "\"UTC\"}"},
             {"type": "toolcall_end", "contentIndex": 1}, {"type": "done", "reason": "toolUse", "usage": usage}],
    "error": [{"type": "start"}, {"type": "error", "reason": "error", "errorMessage": "no", "usage": usage}],
}
for name, events in proxy_replies.items():
    write("pi_proxy_sse", name, "".join(f"data: {json.dumps(e)}\n\n" for e in events))
# Inputs the fuzzer once failed on, kept so they stay fixed.
for path in sorted(glob.glob(os.path.join(here, "regressions", "*", "*"))):
    write(os.path.basename(os.path.dirname(path)), "regression-" + os.path.basename(path), open(path, "rb").read())
for target in sorted(os.listdir(corpus)):
    print(target, len(os.listdir(os.path.join(corpus, target))))
