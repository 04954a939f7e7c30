// pi-agent-core's own Agent, its model calls going through `tiller serve`'s
// /api/stream with pi's streamProxy: one prompt, one tool round.
//
// usage: node pi_proxy_client.mjs NODE_MODULES BASE_URL TOKEN PROVIDER MODEL_ID
// prints one JSON line: {events, messages}
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [modules, proxyUrl, authToken, provider, id] = process.argv.slice(2);
const { Agent, streamProxy } = await import(
  pathToFileURL(join(modules, "@mariozechner/pi-agent-core/dist/index.js")).href
);

// The model as a pi app describes it; the proxy decides where calls go, so the
// base URL is one that must never be used.
const model = {
  id,
  name: id,
  api: "openai-completions",
  provider,
  baseUrl: "http://never.invalid/v1",
  reasoning: false,
  input: ["text"],
  cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0 },
  contextWindow: 8192,
  maxTokens: 1024,
};

const clock = {
  name: "clock",
  label: "Clock",
  description: "Tells the time in a time zone",
  parameters: {
    type: "object",
    properties: { zone: { type: "string" } },
    required: ["zone"],
  },
  execute: async (_id, params) => ({
    content: [{ type: "text", text: `noon in ${params.zone}` }],
    details: {},
  }),
};

const agent = new Agent({
  initialState: { systemPrompt: "Be brief.", model, tools: [clock] },
  streamFn: (m, context, options) => streamProxy(m, context, { ...options, authToken, proxyUrl }),
});
const events = [];
agent.subscribe((event) => {
  events.push(
    event.type === "message_update" ? `message_update:${event.assistantMessageEvent.type}` : event.type,
  );
});
await agent.prompt("What time is it in UTC?");
console.log(JSON.stringify({ events, messages: agent.state.messages }));
