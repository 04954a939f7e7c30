//! One function per decoder of outside input. Each panics (the driver counts a
//! failure) only when the decoder panics or breaks what it promises.

use std::path::Path;
use std::sync::Arc;

use serde_json::Value;
use tiller_ai::{
    Api, AssistantEvent, AssistantMessage, Model, PartialMessage, ResponseDecoder, StreamLimits,
};
use tiller_core::{AgentTool, FnTool, ToolOutput, ToolSet};

use crate::mutate::{Rng, splits};

/// Limits small enough that the fuzzer reaches them.
fn limits() -> StreamLimits {
    StreamLimits {
        max_event_bytes: 64 * 1024,
        max_body_bytes: 1024 * 1024,
        max_content_blocks: 64,
    }
}

/// Feeds `body` to a decoder for `model` in chunks cut where the input's own bytes
/// say, and checks that exactly one terminal event ends it, within the limits.
fn decode(model: &Model, body: &[u8]) {
    let mut decoder = ResponseDecoder::with_limits(model, &limits())
        .unwrap_or_else(|| panic!("{} has a wire format", model.api));
    let mut rng = Rng::new(
        body.iter()
            .fold(body.len() as u64, |h, b| h.rotate_left(5) ^ *b as u64),
    );
    let mut from = 0;
    for cut in splits(body.len(), &mut rng) {
        decoder.feed(&body[from..cut]);
        from = cut;
    }
    decoder.feed(&body[from..]);
    decoder.end();
    assert!(decoder.is_finished(), "the stream did not finish");
    let events: Vec<AssistantEvent> = std::iter::from_fn(|| decoder.next_event()).collect();
    let terminal = events
        .iter()
        .filter(|e| {
            matches!(
                e,
                AssistantEvent::Done { .. } | AssistantEvent::Error { .. }
            )
        })
        .count();
    assert_eq!(terminal, 1, "one terminal event: {events:?}");
    assert!(
        matches!(
            events.last(),
            Some(AssistantEvent::Done { .. } | AssistantEvent::Error { .. })
        ),
        "the terminal event is last"
    );
    assert!(decoder.message().content.len() <= limits().max_content_blocks);
}

/// An OpenAI chat-completions event stream.
pub fn openai_sse(body: &[u8]) {
    decode(&Model::openai_compatible("http://127.0.0.1/v1", "m"), body);
}

/// An Anthropic messages event stream.
pub fn anthropic_sse(body: &[u8]) {
    decode(
        &Model::anthropic_compatible("http://127.0.0.1/v1", "m"),
        body,
    );
}

/// An OpenAI Responses event stream.
pub fn openai_responses_sse(body: &[u8]) {
    decode(
        &Model::speaking(Api::OpenAiResponses, "http://127.0.0.1/v1", "m"),
        body,
    );
}

/// A Bedrock `converse-stream` body: AWS's binary event stream.
pub fn bedrock_eventstream(body: &[u8]) {
    decode(
        &Model::speaking(Api::BedrockConverseStream, "http://127.0.0.1", "m"),
        body,
    );
}

/// A Gemini `streamGenerateContent` event stream.
pub fn gemini_sse(body: &[u8]) {
    decode(
        &Model::speaking(Api::GoogleGenerativeAi, "http://127.0.0.1/v1beta", "m"),
        body,
    );
}

/// pi's proxy events, as `tiller serve`'s `/api/stream` writes them.
pub fn pi_proxy_sse(body: &[u8]) {
    decode(&Model::pi_proxy("http://127.0.0.1", "openai", "m"), body);
}

/// Tool-call arguments streamed as pieces of JSON (split where the input says), as
/// the partial message applies them, then closed.
pub fn partial_json(text: &[u8]) {
    let text = String::from_utf8_lossy(text);
    let model = Model::openai_compatible("http://127.0.0.1/v1", "m");
    let mut partial = PartialMessage::new(AssistantMessage::empty(&model));
    partial.apply(&AssistantEvent::ToolCallStart {
        content_index: 0,
        id: "call_1".into(),
        name: "tool".into(),
    });
    let mut rng = Rng::new(text.len() as u64);
    let mut from = 0;
    for cut in splits(text.len(), &mut rng) {
        if text.is_char_boundary(cut) && cut >= from {
            partial.apply(&AssistantEvent::ToolCallDelta {
                content_index: 0,
                delta: text[from..cut].to_owned(),
            });
            from = cut;
        }
    }
    partial.apply(&AssistantEvent::ToolCallDelta {
        content_index: 0,
        delta: text[from..].to_owned(),
    });
    assert_eq!(partial.message().content.len(), 1);
}

/// An agent file, as YAML or (when the input starts with `{`) as JSON.
pub fn agent_file(text: &[u8]) {
    let text = String::from_utf8_lossy(text);
    let name = if text.trim_start().starts_with('{') {
        "/nonexistent-tiller-fuzz/agent.json"
    } else {
        "/nonexistent-tiller-fuzz/agent.yaml"
    };
    if let Err(error) = tiller::agents::agent_file::AgentFile::parse(Path::new(name), &text) {
        assert!(!error.message.is_empty(), "an error says what is wrong");
    }
}

/// A tool's parameter schema (the first line) and the arguments a model sent (the
/// rest): the schema is compiled as a tool set does, the arguments checked as a run
/// does.
pub fn tool_args(input: &[u8]) {
    let text = String::from_utf8_lossy(input);
    let (schema, args) = text.split_once('\n').unwrap_or((&text, "{}"));
    let Ok(schema) = serde_json::from_str::<Value>(schema) else {
        return;
    };
    let tool = FnTool::new("tool", "A tool", schema, |_args, _ctx| async {
        Ok(ToolOutput::text(""))
    });
    let Ok(tools) = ToolSet::new([Arc::new(tool) as Arc<dyn AgentTool>]) else {
        return;
    };
    let args = serde_json::from_str::<Value>(args).unwrap_or(Value::String(args.to_owned()));
    if let Err(message) = tools.check_arguments("tool", args) {
        assert!(!message.is_empty(), "a refusal says why");
    }
}

/// A fuzz target: panics when the decoder under it fails.
pub type Target = fn(&[u8]);

/// Every target by name, in the order the driver runs them.
pub const ALL: [(&str, Target); 9] = [
    ("openai_sse", openai_sse),
    ("openai_responses_sse", openai_responses_sse),
    ("anthropic_sse", anthropic_sse),
    ("gemini_sse", gemini_sse),
    ("bedrock_eventstream", bedrock_eventstream),
    ("pi_proxy_sse", pi_proxy_sse),
    ("partial_json", partial_json),
    ("agent_file", agent_file),
    ("tool_args", tool_args),
];
