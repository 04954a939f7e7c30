// The npm `openai` package's client against `tiller serve`'s OpenAI routes, as
// its users call it: the model list, a completion that starts a session (its
// id read from the answer's `x-tiller-session`), and a streamed one that
// continues it.
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
console.log(JSON.stringify("ok"));
