// AG-UI's own client (`HttpAgent` of `@ag-ui/client`, which checks the order
// of the events it reads) against `tiller serve`'s `POST /ag-ui/{definition}`:
// the events of one run, and the messages the agent's state holds after it.
//
// usage: node ag_ui_client.mjs NODE_MODULES BASE_URL DEFINITION
// prints {events, messages} (JSON)
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [modules, base, definition] = process.argv.slice(2);
const { HttpAgent } = await import(pathToFileURL(join(modules, "@ag-ui/client/dist/index.mjs")).href);

const agent = new HttpAgent({
  url: `${base}/ag-ui/${definition}`,
  threadId: "thread-1",
  initialMessages: [{ id: "u1", role: "user", content: "What does cat say?" }],
});
const events = [];
await agent.runAgent({ runId: "run-1" }, { onEvent: ({ event }) => { events.push(event.type); } });
const messages = agent.messages.map((message) => ({
  role: message.role,
  content: message.content,
  toolCalls: (message.toolCalls ?? []).map((call) => call.function.name),
}));
console.log(JSON.stringify({ events, messages }));
