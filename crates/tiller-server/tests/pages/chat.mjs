// A chat page as a web app would write it on AG-UI's own client (`HttpAgent`
// of `@ag-ui/client`), against the `tooled` agent of the server that serves
// it: each answer streams into the page as it comes, and a call waiting for
// approval (the run's interrupt) shows as a question to the user. Bundled for
// the browser by esbuild in the test.
import { HttpAgent } from "@ag-ui/client";

const agent = new HttpAgent({ url: "/ag-ui/tooled", threadId: "browser-thread" });
const log = document.querySelector("#log");
const input = document.querySelector("#text");
let turn = 0;

document.querySelector("#form").addEventListener("submit", async (event) => {
  event.preventDefault();
  turn += 1;
  agent.messages.push({ id: `user-${turn}`, role: "user", content: input.value });
  input.value = "";
  const answer = document.createElement("p");
  answer.className = "answer";
  log.append(answer);
  try {
    await agent.runAgent(
      { runId: `run-${turn}` },
      {
        onTextMessageContentEvent({ event }) {
          answer.textContent += event.delta;
        },
        onRunFinishedEvent({ event }) {
          for (const interrupt of event.outcome?.interrupts ?? []) {
            const ask = document.createElement("p");
            ask.className = "approval";
            ask.textContent = `Approve ${interrupt.metadata.toolName}? ${interrupt.message}`;
            log.append(ask);
          }
          answer.dataset.done = "true";
        },
      },
    );
  } catch (error) {
    answer.className = "error";
    answer.textContent = String(error);
  }
});
