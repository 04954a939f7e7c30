//! The lean wire over real HTTP: a long answer costs its length on the event
//! stream and the WebSocket, not its square; a client back or new in the
//! middle of an answer gets one snapshot and rebuilds the answer exactly; the
//! full form is there for whoever asks.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use futures::StreamExt;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tiller::faux::{FauxProvider, FauxTurn};
use tiller::wire::Rebuild;
use tiller::{AgentEvent, Delivered};
use tiller_server::ServerConfig;

mod support;
use support::*;

/// A 100,000-character answer, with quotes and line breaks to escape.
fn long_answer() -> String {
    "Line \"one\" of many.\n"
        .chars()
        .cycle()
        .take(100_000)
        .collect()
}

/// Room for every event of a long answer, in each client's queue and the
/// replay buffer.
fn roomy() -> ServerConfig {
    ServerConfig {
        replay_events: 65_536,
        client_buffer: 65_536,
        ..ServerConfig::default()
    }
}

/// A server whose faux model answers `turn`, and a `helper` agent's id there.
async fn answering(turn: FauxTurn) -> (Running, String) {
    let faux = FauxProvider::new();
    faux.push(turn);
    let server = Running::start(&faux, roomy()).await;
    let id = server.create_helper().await;
    (server, id)
}

/// Prompts agent `id` of `server`.
async fn prompt(server: &Running, id: &str) {
    server
        .post(&format!("/agents/{id}/prompt"), json!({"text": "go"}))
        .await;
}

/// The text of the answer as the last update of `envelopes` (JSON, in order)
/// leaves it, rebuilt by [`Rebuild`].
fn rebuilt(envelopes: &[Value]) -> String {
    let mut rebuild = Rebuild::default();
    let mut last = None;
    for envelope in envelopes {
        let envelope = rebuild
            .envelope(envelope.to_string().as_bytes())
            .unwrap_or_else(|error| panic!("{error}: {envelope}"));
        if let Delivered::Event(AgentEvent::MessageUpdate { message, .. }) = envelope.event {
            last = Some(message);
        }
    }
    last.expect("an update").get().text()
}

/// The bytes a lean `message_update` may take: 200 besides its piece, escaped.
fn within_bound(data: &str, event: &Value) {
    let piece = &event["event"]["assistant_message_event"];
    let escaped = piece
        .get("delta")
        .map_or(0, |delta| delta.to_string().len());
    assert!(
        data.len() <= 200 + escaped,
        "{} bytes for a piece of {escaped}: {data}",
        data.len()
    );
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn socket(server: &Running, path: &str) -> Socket {
    let url = format!("{}{path}", server.base.replace("http://", "ws://"));
    tokio_tungstenite::connect_async(url).await.unwrap().0
}

/// Text frames up to and including `agent_end`: each one's JSON and bytes.
async fn frames_until_end(socket: &mut Socket) -> Vec<(Value, usize)> {
    let mut frames = Vec::new();
    while let Some(message) = socket.next().await {
        if let tokio_tungstenite::tungstenite::Message::Text(text) = message.unwrap() {
            let json: Value = serde_json::from_str(text.as_str()).unwrap();
            let end = json["event"]["type"] == "agent_end";
            frames.push((json, text.len()));
            if end {
                return frames;
            }
        }
    }
    panic!("the socket closed before agent_end");
}

#[tokio::test]
async fn a_long_answer_costs_its_length_on_the_event_stream_and_the_websocket() {
    let answer = long_answer();
    let (server, id) = answering(FauxTurn::text(answer.clone()).chunk_size(8)).await;
    let mut sse = server.events(&id, None).await;
    let mut ws = socket(&server, &format!("/agents/{id}/ws")).await;
    prompt(&server, &id).await;

    let events = sse.until_end().await;
    let updates = events
        .iter()
        .filter(|event| event.kind == "message_update")
        .count();
    assert_eq!(updates, 100_000 / 8 + 2, "text_start, the pieces, text_end");
    for event in events.iter().filter(|event| event.kind == "message_update") {
        within_bound(&event.data.to_string(), &event.data);
    }
    // The answer goes whole in message_end, turn_end and agent_end, and once in
    // pieces: about four times its length, where whole updates took
    // 12,500 × 50,000 bytes on average.
    let total = sse.bytes_read();
    assert!(
        total < 4 * answer.len() + 250 * events.len() + 40_000,
        "{total} bytes of SSE for {} events",
        events.len()
    );
    let envelopes: Vec<Value> = events.iter().map(|event| event.data.clone()).collect();
    assert_eq!(rebuilt(&envelopes), answer);

    let frames = frames_until_end(&mut ws).await;
    let socket_bytes: usize = frames.iter().map(|(_, bytes)| bytes).sum();
    assert!(socket_bytes < 4 * answer.len() + 250 * frames.len() + 40_000);
    let sent: Vec<Value> = frames.into_iter().map(|(json, _)| json).collect();
    assert_eq!(sent, envelopes, "the socket's frames are the stream's data");
    server.stop().await;
}

#[tokio::test]
async fn a_client_back_in_the_middle_of_an_answer_rebuilds_it_exactly() {
    let answer = long_answer();
    let (server, id) = answering(FauxTurn::text(answer.clone()).chunk_size(8)).await;
    let mut sse = server.events(&id, None).await;
    prompt(&server, &id).await;
    let events = sse.until_end().await;
    let middle = events
        .iter()
        .filter(|event| event.kind == "message_update")
        .nth(6_000)
        .unwrap()
        .id;

    // Over SSE with Last-Event-ID, and over a WebSocket with ?after=.
    let mut resumed = server.events(&id, Some(middle)).await;
    let again: Vec<Value> = resumed
        .until_end()
        .await
        .into_iter()
        .map(|event| event.data)
        .collect();
    let mut ws = socket(&server, &format!("/agents/{id}/ws?after={middle}")).await;
    let over_socket: Vec<Value> = frames_until_end(&mut ws)
        .await
        .into_iter()
        .map(|(json, _)| json)
        .collect();
    assert_eq!(over_socket, again);

    // One snapshot: the answer as it stood after the next piece, then pieces.
    let snapshot = &again[0]["event"];
    assert_eq!(again[0]["seq"], json!(middle + 1));
    let so_far: String = answer.chars().take(6_001 * 8).collect();
    assert_eq!(
        snapshot["message"]["content"],
        json!([{"type": "text", "text": so_far}])
    );
    assert!(
        again[1..]
            .iter()
            .filter(|envelope| envelope["event"]["type"] == "message_update")
            .all(|envelope| envelope["event"].get("message").is_none())
    );
    assert_eq!(rebuilt(&again), answer);
    server.stop().await;
}

#[tokio::test]
async fn a_websocket_opened_in_the_middle_of_an_answer_starts_from_a_snapshot() {
    let answer: String = long_answer().chars().take(4_000).collect();
    // Paced as a model streams, so that the answer is under way when the socket
    // opens.
    let turn = FauxTurn::text(answer.clone())
        .chunk_size(4)
        .delay(Duration::from_millis(2));
    let (server, id) = answering(turn).await;
    let mut sse = server.events(&id, None).await;
    prompt(&server, &id).await;
    let mut pieces = 0;
    while pieces < 20 {
        if sse.next().await.kind == "message_update" {
            pieces += 1;
        }
    }
    let mut ws = socket(&server, &format!("/agents/{id}/ws")).await;
    let joined: Vec<Value> = frames_until_end(&mut ws)
        .await
        .into_iter()
        .map(|(json, _)| json)
        .collect();
    let first_update = joined
        .iter()
        .find(|envelope| envelope["event"]["type"] == "message_update")
        .unwrap();
    assert_eq!(first_update["event"]["message"]["role"], "assistant");
    assert_eq!(rebuilt(&joined), answer);
    server.stop().await;
}

#[tokio::test]
async fn updates_full_carries_each_update_whole_as_asked() {
    let (server, id) = answering(FauxTurn::text("Whole, every time.").chunk_size(6)).await;
    let mut full = server
        .stream(&format!("/agents/{id}/events?updates=full"), &[])
        .await;
    prompt(&server, &id).await;
    let texts: Vec<Value> = full
        .until_end()
        .await
        .into_iter()
        .filter(|event| event.kind == "message_update")
        .map(|event| event.data["event"]["message"]["content"][0]["text"].clone())
        .collect();
    assert_eq!(
        texts,
        [
            json!(""),
            json!("Whole,"),
            json!("Whole, every"),
            json!("Whole, every time."),
            json!("Whole, every time.")
        ]
    );

    let (status, problem) = server
        .get(&format!("/agents/{id}/events?updates=some"))
        .await;
    assert_eq!(
        (status, &problem["field"]),
        (422, &json!("updates")),
        "{problem}"
    );
    server.stop().await;
}

/// The figure the lean wire was built for: a 2,000-character answer streamed
/// in 4-character pieces took 787 KB of SSE with every update whole (as
/// `?updates=full` still sends it). Lean, each of its 502 updates is about 213
/// bytes, 49 of them the agent's id each envelope names: 116 KB in all.
#[tokio::test]
async fn a_two_thousand_character_answer_costs_its_pieces_in_sse() {
    let answer: String = "abcdefghij".repeat(200);
    let (server, id) = answering(FauxTurn::text(answer).chunk_size(4)).await;
    assert_eq!(id.len(), 36, "an agent id as the server makes them");
    let mut sse = server.events(&id, None).await;
    let mut full = server
        .stream(&format!("/agents/{id}/events?updates=full"), &[])
        .await;
    prompt(&server, &id).await;
    sse.until_end().await;
    full.until_end().await;
    let bytes = sse.bytes_read();
    eprintln!(
        "a 2,000-character answer in 4-character pieces: {bytes} bytes of SSE ({} whole)",
        full.bytes_read()
    );
    assert!(bytes <= 120_000, "{bytes} bytes");
    assert!(full.bytes_read() > 6 * bytes);
    server.stop().await;
}
