// The npm `openai` package's client against `tiller serve`'s OpenAI routes, as
// its users call it: the model list, a completion that starts a session (its
// id read from the answer's `x-tiller-session`), and a streamed one that
// continues it; a streamed response, and one that continues it by
// `previous_response_id`.
//
// usage: node openai_client.mjs NODE_MODULES BASE_URL
// prints `"ok"` (JSON)
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import assert from "node:assert/strict";

const [modules, base] = process.argv.slice(2);
const { default: OpenAI } = await import(pathToFileURL(join(modules, "openai/index.mjs")).href);
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: "unused" });

const models = [];
for await (const model of client.models.list()) models.push(model.id);
assert.ok(models.includes("helper"), models.join(", "));

const { data: completion, response } = await client.chat.completions
  .create({ model: "helper", messages: [{ role: "user", content: "hello" }] })
  .withResponse();
const session = response.headers.get("x-tiller-session");
assert.ok(session, "no x-tiller-session");
assert.ok(completion.choices[0].message.content.startsWith('You said: "hello".'), completion);
assert.equal(completion.choices[0].finish_reason, "stop");

const stream = await client.chat.completions.create(
  { model: "helper", messages: [{ role: "user", content: "again" }], stream: true },
  { headers: { "X-Tiller-Session": session } },
);
let text = "";
const finishes = [];
for await (const chunk of stream) {
  for (const choice of chunk.choices) {
    text += choice.delta.content ?? "";
    if (choice.finish_reason) finishes.push(choice.finish_reason);
  }
}
assert.ok(text.startsWith('You said: "again".'), text);
assert.deepEqual(finishes, ["stop"]);

const state = await (await fetch(`${base}/agents/${session}`)).json();
assert.deepEqual(
  state.messages.map((message) => message.role),
  ["user", "assistant", "user", "assistant"],
);
const events = await client.responses.create({ model: "helper", input: "hello", stream: true });
let said = "";
let completed;
for await (const event of events) {
  if (event.type === "response.output_text.delta") said += event.delta;
  if (event.type === "response.completed") completed = event.response;
}
assert.ok(said.startsWith('You said: "hello".'), said);
assert.equal(completed.status, "completed");
const again = await client.responses.create({
  model: "helper",
  input: [{ role: "user", content: "again" }],
  previous_response_id: completed.id,
});
assert.ok(again.output_text.startsWith('You said: "again".'), again.output_text);

console.log(JSON.stringify("ok"));
