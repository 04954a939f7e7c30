// The npm `openai` package's `responses.create` continuing, by
// `previous_response_id`, a response a server made before it restarted.
//
// usage: node openai_responses.mjs NODE_MODULES BASE_URL PREVIOUS_ID
// prints the new response's id (JSON)
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import assert from "node:assert/strict";

const [modules, base, previous] = process.argv.slice(2);
const { default: OpenAI } = await import(pathToFileURL(join(modules, "openai/index.mjs")).href);
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: "unused" });

const events = await client.responses.create({
  model: "helper",
  input: "from node",
  previous_response_id: previous,
  stream: true,
});
let said = "";
let completed;
for await (const event of events) {
  if (event.type === "response.output_text.delta") said += event.delta;
  if (event.type === "response.completed") completed = event.response;
}
assert.ok(said.startsWith('You said: "from node".'), said);
assert.equal(completed.previous_response_id, previous);
console.log(JSON.stringify(completed.id));
