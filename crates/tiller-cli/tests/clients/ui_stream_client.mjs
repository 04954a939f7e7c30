// The AI SDK's chat transport (the one `useChat` uses) and its reader of the
// UI message stream against `tiller serve`'s `POST /ai-sdk/{definition}`: the
// message it renders, with the agent's tool part and its answer.
//
// usage: node ui_stream_client.mjs NODE_MODULES BASE_URL DEFINITION
// prints the rendered message's parts (JSON)
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [modules, base, definition] = process.argv.slice(2);
const { DefaultChatTransport, readUIMessageStream } = await import(
  pathToFileURL(join(modules, "ai/dist/index.js")).href
);

const transport = new DefaultChatTransport({ api: `${base}/ai-sdk/${definition}` });
const stream = await transport.sendMessages({
  chatId: "chat-1",
  trigger: "submit-message",
  messageId: undefined,
  abortSignal: undefined,
  messages: [{ id: "u1", role: "user", parts: [{ type: "text", text: "What does cat say?" }] }],
});
let last;
for await (const message of readUIMessageStream({ stream, terminateOnError: true })) last = message;
const parts = last.parts.map((part) =>
  part.type === "text"
    ? { type: part.type, text: part.text, state: part.state }
    : part.type === "dynamic-tool"
      ? { type: part.type, toolName: part.toolName, state: part.state, input: part.input, output: part.output }
      : { type: part.type },
);
console.log(JSON.stringify({ parts, metadata: last.metadata }));
