// pi-agent-core's own Agent following an agent of `tiller serve` through its
// lean server-sent events: each update's message is rebuilt from its piece by
// the README's `rebuild` (taken from README.md as written there), then each
// event, its keys in pi's camelCase, goes through the Agent's own reducer
// (`processEvents`), and a subscriber renders what the Agent then holds as its
// streaming message, the way a pi interface does.
//
// usage: node pi_events_client.mjs NODE_MODULES README BASE_URL AGENT_ID PROMPT
// prints one JSON line: {rendered, messages}
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [modules, readme, base, agentId, prompt] = process.argv.slice(2);
const section = readFileSync(readme, "utf8").split("### Rebuilding a message")[1];
const rebuild = new Function(`${section.match(/```js\n([\s\S]*?)```/)[1]}\nreturn rebuild;`)();
const { Agent } = await import(
  pathToFileURL(join(modules, "@mariozechner/pi-agent-core/dist/index.js")).href
);

/** Tiller's snake_case keys, and the block type and role pi names otherwise. */
const PI_NAMES = { tool_call: "toolCall", tool_result: "toolResult" };
function camel(value) {
  if (Array.isArray(value)) return value.map(camel);
  if (value === null || typeof value !== "object") return value;
  const out = {};
  for (const [key, inner] of Object.entries(value)) {
    const name = key.replace(/_([a-z])/g, (_, letter) => letter.toUpperCase());
    out[name] = (name === "type" || name === "role") && inner in PI_NAMES ? PI_NAMES[inner] : camel(inner);
  }
  return out;
}

const textOf = (message) =>
  (message?.content ?? []).filter((block) => block.type === "text").map((block) => block.text).join("");

const agent = new Agent({ initialState: { systemPrompt: "", tools: [] } });
const rendered = [];
agent.subscribe((event) => {
  if (event.type === "message_update") rendered.push(textOf(agent.state.streamingMessage));
});

const events = await fetch(`${base}/agents/${agentId}/events`);
if (!events.ok) throw new Error(`events: ${events.status}`);
const prompted = await fetch(`${base}/agents/${agentId}/prompt`, {
  method: "POST",
  headers: { "content-type": "application/json" },
  body: JSON.stringify({ text: prompt }),
});
if (!prompted.ok) throw new Error(`prompt: ${prompted.status}`);

await agent.runWithLifecycle(async () => {
  const reader = events.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let message;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) throw new Error("the event stream ended before agent_end");
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const frame = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = frame.split("\n").filter((line) => line.startsWith("data:")).map((line) => line.slice(5).trim()).join("\n");
      if (!data) continue;
      const lean = JSON.parse(data).event;
      message = rebuild(message, lean);
      const event = camel(lean.type === "message_update" ? { ...lean, message } : lean);
      await agent.processEvents(event);
      if (event.type === "agent_end") {
        await reader.cancel();
        return;
      }
    }
  }
});
console.log(JSON.stringify({ rendered, messages: agent.state.messages.map((m) => [m.role, textOf(m)]) }));
