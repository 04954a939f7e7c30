//! The protocols clients already speak, over real HTTP, each mapped from the
//! same run: the OpenAI API's responses (a stream's events in order, a
//! previous response continued), the AI SDK's UI message stream and AG-UI (a
//! tool call, its result, the answer, and a call waiting for approval, which
//! AG-UI's `resume` approves).

#![allow(clippy::unwrap_used)]

mod support;

use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use support::{Running, closed};
use tiller::faux::{FauxProvider, FauxTurn};
use tiller_server::ServerConfig;

/// The JSON `data:` payloads of a stream, in order, and whether `[DONE]`
/// ended it.
fn read(body: &str) -> (Vec<Value>, bool) {
    let mut done = false;
    let events = body
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .filter(|data| {
            done = *data == "[DONE]";
            !done
        })
        .map(|data| serde_json::from_str(data).unwrap())
        .collect();
    (events, done)
}

fn kinds(events: &[Value]) -> Vec<&str> {
    events
        .iter()
        .map(|event| event["type"].as_str().unwrap())
        .collect()
}

/// The roles of the transcript of the agent `id`.
async fn roles(server: &Running, id: &str) -> Vec<String> {
    let (_, state) = server.get(&format!("/agents/{id}")).await;
    state["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|message| message["role"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn a_response_stream_tells_each_text_as_an_item_and_a_previous_response_goes_on() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::tool_call("cat", json!({"x": 1})));
    faux.push(FauxTurn::text("It said x is 1.").chunk_size(8));
    faux.push(FauxTurn::text("Still 1."));
    let server = Running::tooled(&faux, ServerConfig::default()).await;
    let response = server
        .http
        .post(format!("{}/v1/responses", server.base))
        .json(&json!({"model": "tooled", "input": "What is x?", "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let session = response.headers()["x-tiller-session"]
        .to_str()
        .unwrap()
        .to_owned();
    let (events, _) = read(&response.text().await.unwrap());
    assert_eq!(
        kinds(&events),
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    let numbers: Vec<u64> = events
        .iter()
        .map(|event| event["sequence_number"].as_u64().unwrap())
        .collect();
    assert_eq!(numbers, (0..10).collect::<Vec<_>>());
    let completed = &events[9]["response"];
    assert_eq!(completed["status"], "completed");
    assert_eq!(
        completed["output"][0]["content"][0],
        json!({"type": "output_text", "text": "It said x is 1.", "annotations": []})
    );
    assert!(completed["usage"]["output_tokens"].as_u64().unwrap() > 0);
    let id = completed["id"].as_str().unwrap();

    let (status, response) = server
        .post(
            "/v1/responses",
            json!({"model": "tooled", "input": [{"role": "user", "content": "And now?"}],
                   "previous_response_id": id}),
        )
        .await;
    assert_eq!(status, 200, "{response}");
    assert_eq!(response["status"], "completed");
    assert_eq!(response["previous_response_id"], id);
    assert_eq!(response["output"][0]["content"][0]["text"], "Still 1.");
    assert_eq!(
        roles(&server, &session).await,
        [
            "user",
            "assistant",
            "tool_result",
            "assistant",
            "user",
            "assistant"
        ]
    );

    // An id that is not a response's, one whose session there is not, and an
    // item the agent would not take.
    let refusals = [
        (
            json!({"previous_response_id": "resp_zz"}),
            422,
            "param",
            "previous_response_id",
        ),
        (
            json!({"previous_response_id": "resp_6e6f6e65_1"}),
            404,
            "code",
            "unknown-session",
        ),
        (
            json!({"input": [{"type": "function_call_output", "call_id": "c", "output": "1"}]}),
            422,
            "param",
            "input[0]",
        ),
    ];
    for (fields, expected, key, said) in refusals {
        let mut request = json!({"model": "tooled", "input": "hi"});
        for (name, value) in fields.as_object().unwrap() {
            request[name] = value.clone();
        }
        let (status, error) = server.post("/v1/responses", request).await;
        assert_eq!((status, &error["error"][key]), (expected, &json!(said)));
    }
    server.stop().await;
}

#[tokio::test]
async fn a_parked_response_is_incomplete_and_a_conversation_is_its_session() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::tool_call("remove", json!({"path": "a"})));
    faux.push(FauxTurn::text("Hello again."));
    let server = Running::tooled(&faux, ServerConfig::default()).await;
    let (status, response) = server
        .post(
            "/v1/responses",
            json!({"model": "tooled", "input": "Remove a.", "conversation": "chat-7"}),
        )
        .await;
    assert_eq!(status, 200, "{response}");
    assert_eq!(response["status"], "incomplete");
    assert_eq!(response["incomplete_details"], json!({"reason": "parked"}));
    assert_eq!(response["conversation"], json!({"id": "chat-7"}));
    // On an open server the conversation's id is the session's.
    let (_, state) = server.get("/agents/chat-7").await;
    assert_eq!(state["status"], "waiting_for_input");
    server.stop().await;
}

#[tokio::test]
async fn the_ui_message_stream_carries_the_tools_the_text_and_an_approval() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::tool_call("cat", json!({"x": 1})));
    faux.push(FauxTurn::text("It said x is 1.").chunk_size(8));
    faux.push(FauxTurn::tool_call("remove", json!({"path": "a"})));
    let server = Running::tooled(&faux, ServerConfig::default()).await;
    let post = |text: &str| {
        json!({"id": "chat-1", "trigger": "submit-message", "messages": [
            {"id": "m1", "role": "user", "parts": [{"type": "text", "text": text}]},
        ]})
    };
    let response = server
        .http
        .post(format!("{}/ai-sdk/tooled", server.base))
        .json(&post("What is x?"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-vercel-ai-ui-message-stream"], "v1");
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let (chunks, done) = read(&response.text().await.unwrap());
    assert!(done);
    assert_eq!(
        kinds(&chunks),
        [
            "start",
            "start-step",
            "tool-input-start",
            "tool-input-delta",
            "tool-input-available",
            "tool-output-available",
            "finish-step",
            "start-step",
            "text-start",
            "text-delta",
            "text-delta",
            "text-end",
            "finish-step",
            "finish",
        ]
    );
    assert_eq!(chunks[4]["input"], json!({"x": 1}));
    assert_eq!(chunks[5]["output"], r#"{"x":1}"#);
    assert_eq!(chunks[5]["toolCallId"], chunks[2]["toolCallId"]);
    let text: String = chunks
        .iter()
        .filter_map(|chunk| chunk["delta"].as_str())
        .collect();
    assert_eq!(text, "It said x is 1.");
    assert_eq!(
        chunks[13],
        json!({"type": "finish", "finishReason": "stop",
               "messageMetadata": {"session": "chat-1", "end": "completed"}})
    );

    // The chat goes on in its session; a call waiting for approval is a data part.
    let (status, body) = server
        .post_raw("/ai-sdk/tooled", &[], &post("Remove a."))
        .await;
    assert_eq!(status, 200);
    let (chunks, _) = read(&body);
    let approval = chunks
        .iter()
        .find(|chunk| chunk["type"] == "data-tiller-approval")
        .unwrap();
    assert_eq!(approval["data"]["toolName"], "remove");
    assert_eq!(approval["data"]["input"], json!({"path": "a"}));
    assert_eq!(chunks.last().unwrap()["messageMetadata"]["end"], "parked");
    assert_eq!(
        roles(&server, "chat-1").await,
        [
            "user",
            "assistant",
            "tool_result",
            "assistant",
            "user",
            "assistant",
            "custom"
        ]
    );
    server.stop().await;
}

#[tokio::test]
async fn ag_ui_runs_tell_the_tools_and_the_text_and_resume_an_interrupt() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::tool_call("cat", json!({"x": 1})));
    faux.push(FauxTurn::text("It said x is 1.").chunk_size(8));
    faux.push(FauxTurn::tool_call("remove", json!({"path": "a"})));
    faux.push(FauxTurn::text("Removed."));
    let server = Running::tooled(&faux, ServerConfig::default()).await;
    let input = |run: &str, text: &str| {
        json!({"threadId": "thread-1", "runId": run, "state": {}, "tools": [], "context": [],
               "forwardedProps": {},
               "messages": [{"id": "u1", "role": "user", "content": text}]})
    };
    let (status, body) = server
        .post_raw("/ag-ui/tooled", &[], &input("run-1", "What is x?"))
        .await;
    assert_eq!(status, 200, "{body}");
    let (events, done) = read(&body);
    assert!(!done);
    assert_eq!(
        kinds(&events),
        [
            "RUN_STARTED",
            "STATE_SNAPSHOT",
            "TOOL_CALL_START",
            "TOOL_CALL_ARGS",
            "TOOL_CALL_END",
            "TOOL_CALL_RESULT",
            "TEXT_MESSAGE_START",
            "TEXT_MESSAGE_CONTENT",
            "TEXT_MESSAGE_CONTENT",
            "TEXT_MESSAGE_END",
            "RUN_FINISHED",
        ]
    );
    assert_eq!(
        events[0],
        json!({"type": "RUN_STARTED", "threadId": "thread-1", "runId": "run-1"})
    );
    assert_eq!(events[1], json!({"type": "STATE_SNAPSHOT", "snapshot": {}}));
    assert_eq!(events[2]["toolCallName"], "cat");
    assert_eq!(events[5]["content"], r#"{"x":1}"#);
    assert_eq!(events[10]["outcome"], json!({"type": "success"}));

    // A call waiting for approval is the run's interrupt; `resume` approves it.
    let (_, body) = server
        .post_raw("/ag-ui/tooled", &[], &input("run-2", "Remove a."))
        .await;
    let (events, _) = read(&body);
    assert_eq!(
        kinds(&events),
        [
            "RUN_STARTED",
            "STATE_SNAPSHOT",
            "TOOL_CALL_START",
            "TOOL_CALL_ARGS",
            "TOOL_CALL_END",
            "RUN_FINISHED"
        ]
    );
    let finished = events.last().unwrap();
    assert_eq!(finished["type"], "RUN_FINISHED");
    let interrupt = &finished["outcome"]["interrupts"][0];
    assert_eq!(
        (&finished["outcome"]["type"], &interrupt["reason"]),
        (&json!("interrupt"), &json!("approval"))
    );
    let call = interrupt["toolCallId"].as_str().unwrap();
    assert_eq!(interrupt["id"], call);
    let mut resume = input("run-3", "ignored");
    resume["resume"] =
        json!([{"interruptId": call, "status": "resolved", "payload": {"approved": true}}]);
    let (_, body) = server.post_raw("/ag-ui/tooled", &[], &resume).await;
    let (events, _) = read(&body);
    assert_eq!(
        kinds(&events),
        [
            "RUN_STARTED",
            "STATE_SNAPSHOT",
            "TOOL_CALL_RESULT",
            "TEXT_MESSAGE_START",
            "TEXT_MESSAGE_CONTENT",
            "TEXT_MESSAGE_END",
            "RUN_FINISHED",
        ]
    );
    assert_eq!(events[2]["content"], r#"{"path":"a"}"#);
    assert_eq!(events[4]["delta"], "Removed.");
    assert_eq!(
        roles(&server, "thread-1").await,
        [
            "user",
            "assistant",
            "tool_result",
            "assistant",
            "user",
            "assistant",
            "custom",
            "custom",
            "tool_result",
            "assistant"
        ]
    );
    server.stop().await;
}

#[tokio::test]
async fn on_a_server_of_tenants_a_clients_ids_are_its_own() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("Hello, acme."));
    faux.push(FauxTurn::text("Hello, globex."));
    let server = Running::tooled(
        &faux,
        closed(&[("acme-token", "acme"), ("globex-token", "globex")]),
    )
    .await;
    let thread = json!({"threadId": "thread-1", "runId": "r", "messages": [
        {"id": "u1", "role": "user", "content": "hi"},
    ]});
    let mut sessions = Vec::new();
    for token in ["acme-token", "globex-token"] {
        let response = server
            .http
            .post(format!("{}/ag-ui/tooled", server.base))
            .bearer_auth(token)
            .json(&thread)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        sessions.push(
            response.headers()["x-tiller-session"]
                .to_str()
                .unwrap()
                .to_owned(),
        );
        let (events, _) = read(&response.text().await.unwrap());
        assert_eq!(events.last().unwrap()["type"], "RUN_FINISHED");
    }
    // The same thread id is two sessions, neither named by the client.
    assert_ne!(sessions[0], sessions[1]);
    assert!(
        sessions
            .iter()
            .all(|session| session.starts_with("conversation-"))
    );
    server.stop().await;
}

#[tokio::test]
async fn ag_ui_answering_one_of_two_interrupts_streams_its_result_and_names_the_other() {
    let faux = FauxProvider::new();
    faux.push(
        FauxTurn::tool_call("remove", json!({"path": "a"}))
            .with_tool_call("remove", json!({"path": "b"})),
    );
    faux.push(FauxTurn::text("Both removed."));
    let server = Running::tooled(&faux, ServerConfig::default()).await;
    let input = |run: &str| {
        json!({"threadId": "thread-2", "runId": run,
               "messages": [{"id": "u1", "role": "user", "content": "Remove a and b."}]})
    };
    let (_, body) = server.post_raw("/ag-ui/tooled", &[], &input("run-1")).await;
    let (events, _) = read(&body);
    let interrupts = events.last().unwrap()["outcome"]["interrupts"].clone();
    let calls: Vec<&str> = interrupts
        .as_array()
        .unwrap()
        .iter()
        .map(|interrupt| interrupt["toolCallId"].as_str().unwrap())
        .collect();
    assert_eq!(calls.len(), 2, "{interrupts}");

    // The first approved: its result is told, and the second is still asked.
    let mut resume = input("run-2");
    resume["resume"] =
        json!([{"interruptId": calls[0], "status": "resolved", "payload": {"approved": true}}]);
    let (_, body) = server.post_raw("/ag-ui/tooled", &[], &resume).await;
    let (events, _) = read(&body);
    assert_eq!(
        kinds(&events),
        [
            "RUN_STARTED",
            "STATE_SNAPSHOT",
            "TOOL_CALL_RESULT",
            "RUN_FINISHED"
        ]
    );
    assert_eq!(events[2]["toolCallId"], calls[0]);
    let still = &events[3]["outcome"]["interrupts"];
    assert_eq!(still.as_array().unwrap().len(), 1, "{still}");
    assert_eq!(still[0]["toolCallId"], calls[1]);

    // Both answered at once (the second again, denied): one stream tells both runs.
    let mut resume = input("run-3");
    resume["resume"] = json!([{"interruptId": calls[1], "status": "cancelled"}]);
    let (_, body) = server.post_raw("/ag-ui/tooled", &[], &resume).await;
    let (events, _) = read(&body);
    assert_eq!(
        kinds(&events),
        [
            "RUN_STARTED",
            "STATE_SNAPSHOT",
            "TOOL_CALL_RESULT",
            "TEXT_MESSAGE_START",
            "TEXT_MESSAGE_CONTENT",
            "TEXT_MESSAGE_END",
            "RUN_FINISHED"
        ]
    );
    assert_eq!(events[6]["outcome"], json!({"type": "success"}));

    // A thread with nothing there has nothing to resume.
    let mut resume = input("run-4");
    resume["threadId"] = json!("thread-none");
    resume["resume"] = json!([{"interruptId": "c", "status": "cancelled"}]);
    let (status, problem) = server.post("/ag-ui/tooled", resume).await;
    assert_eq!(
        (status, &problem["type"]),
        (404, &json!("urn:tiller:problem:unknown-session"))
    );
    server.stop().await;
}

#[tokio::test]
async fn an_aborted_ag_ui_run_ends_what_it_left_open_and_is_cancelled() {
    let faux = FauxProvider::new();
    faux.push(
        FauxTurn::text("a slow answer that will not be finished")
            .chunk_size(4)
            .delay(std::time::Duration::from_millis(200)),
    );
    let server = Running::tooled(&faux, ServerConfig::default()).await;
    let input = json!({"threadId": "thread-3", "runId": "r",
                       "messages": [{"id": "u1", "role": "user", "content": "Go."}]});
    let response = server
        .http
        .post(format!("{}/ag-ui/tooled", server.base))
        .json(&input)
        .send()
        .await
        .unwrap();
    let mut body = response.bytes_stream();
    let mut text = String::new();
    // Aborted once the answer is streaming.
    while !text.contains("TEXT_MESSAGE_CONTENT") {
        text.push_str(
            std::str::from_utf8(&futures::StreamExt::next(&mut body).await.unwrap().unwrap())
                .unwrap(),
        );
    }
    let (status, _) = server.post("/agents/thread-3/abort", json!({})).await;
    assert_eq!(status, 204);
    while let Some(bytes) = futures::StreamExt::next(&mut body).await {
        text.push_str(std::str::from_utf8(&bytes.unwrap()).unwrap());
    }
    let (events, _) = read(&text);
    let kinds = kinds(&events);
    assert_eq!(
        kinds[kinds.len() - 2..],
        ["TEXT_MESSAGE_END", "RUN_FINISHED"]
    );
    assert_eq!(
        events.last().unwrap()["outcome"],
        json!({"type": "cancelled"})
    );
    server.stop().await;
}

#[tokio::test]
async fn a_response_going_on_takes_every_input_message_and_a_repeated_key_streams_again() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("First."));
    faux.push(FauxTurn::text("Second."));
    faux.push(FauxTurn::text("Third."));
    faux.push(FauxTurn::text("Fourth."));
    let server = Running::tooled(&faux, ServerConfig::default()).await;
    let (_, first) = server
        .post(
            "/v1/responses",
            json!({"model": "tooled", "input": "One.", "conversation": "c-1"}),
        )
        .await;
    assert_eq!(first["output"][0]["content"][0]["text"], "First.");
    let (_, second) = server
        .post(
            "/v1/responses",
            json!({"model": "tooled", "previous_response_id": first["id"],
                   "input": [{"role": "user", "content": "Two."}, {"role": "user", "content": "Three."}]}),
        )
        .await;
    assert_eq!(second["output"][0]["content"][0]["text"], "Second.");
    let (_, state) = server.get("/agents/c-1").await;
    let said: Vec<&str> = state["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|message| message["role"] == "user")
        .map(|message| message["content"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(said, ["One.", "Two.", "Three."]);

    // A streamed request sent again with the same key is told again, not left hanging.
    let streamed =
        json!({"model": "tooled", "input": "Four.", "conversation": "c-1", "stream": true});
    let (status, body) = server
        .post_raw("/v1/responses", &[("idempotency-key", "k-1")], &streamed)
        .await;
    assert_eq!(status, 200);
    let (events, _) = read(&body);
    assert_eq!(events.last().unwrap()["type"], "response.completed");
    let (status, body) = server
        .post_raw("/v1/responses", &[("idempotency-key", "k-1")], &streamed)
        .await;
    assert_eq!(status, 200);
    let (events, _) = read(&body);
    let completed = &events.last().unwrap()["response"];
    assert_eq!(completed["output"][0]["content"][0]["text"], "Fourth.");
    server.stop().await;
}
