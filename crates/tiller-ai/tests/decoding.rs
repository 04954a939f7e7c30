//! Decoding cases the recordings do not hold: cache and reasoning accounting,
//! quirks of compatible servers, argument repair, and the consumer-side reducer.

#![allow(clippy::unwrap_used)]

mod common;

use common::{assert_well_formed, decode, final_message, model_for};
use pretty_assertions::assert_eq;
use serde_json::json;
use tiller_ai::{
    ArgumentsError, AssistantEvent, Cost, Model, PartialMessage, ResponseDecoder, StopReason,
    StreamError, Usage, catalog,
};
use tiller_test_support::{Cassette, sse};

fn openai_model() -> Model {
    catalog::find("openai/gpt-4o").unwrap()
}

fn anthropic_model() -> Model {
    catalog::find("anthropic/claude-sonnet-4-5").unwrap()
}

fn decode_events(model: &Model, events: &[String]) -> Vec<AssistantEvent> {
    let decoded = decode(model, events.concat().as_bytes(), &[usize::MAX]);
    assert_well_formed(&decoded);
    decoded
}

fn terminal_error(events: &[AssistantEvent]) -> Option<&StreamError> {
    match events.last() {
        Some(AssistantEvent::Error { error, .. }) => Some(error),
        _ => None,
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-12
}

#[test]
fn openai_cached_and_reasoning_tokens_are_counted_once() {
    let events = decode_events(
        &openai_model(),
        &[
            sse::openai_delta(json!({"content": "hi"})),
            sse::openai_finish("stop"),
            sse::data(&json!({"choices": [], "usage": {
                "prompt_tokens": 1000, "completion_tokens": 200, "total_tokens": 1200,
                "prompt_tokens_details": {"cached_tokens": 300},
                "completion_tokens_details": {"reasoning_tokens": 50}
            }})),
            sse::OPENAI_DONE.to_owned(),
        ],
    );
    let usage = final_message(&events).usage;
    assert_eq!(
        [
            usage.input,
            usage.output,
            usage.cache_read,
            usage.cache_write,
            usage.reasoning,
            usage.total_tokens
        ],
        [700, 200, 300, 0, 50, 1200]
    );
    let Cost {
        input,
        output,
        cache_read,
        cache_write,
        total,
    } = usage.cost;
    assert!(close(input, 700.0 * 2.5 / 1e6) && close(output, 200.0 * 10.0 / 1e6));
    assert!(close(cache_read, 300.0 * 1.25 / 1e6) && close(cache_write, 0.0));
    assert!(close(total, input + output + cache_read));
}

#[test]
fn anthropic_cache_tokens_sit_beside_input_tokens() {
    let events = decode_events(
        &anthropic_model(),
        &[
            sse::named(
                "message_start",
                &json!({"type": "message_start", "message": {"usage": {
                    "input_tokens": 100, "cache_read_input_tokens": 2000,
                    "cache_creation_input_tokens": 500, "output_tokens": 1
                }}}),
            ),
            sse::named(
                "content_block_start",
                &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            ),
            sse::named(
                "content_block_delta",
                &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "ok"}}),
            ),
            sse::named(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": 0}),
            ),
            sse::named(
                "message_delta",
                &json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 40}}),
            ),
            sse::named("message_stop", &json!({"type": "message_stop"})),
        ],
    );
    let usage = final_message(&events).usage;
    assert_eq!(
        [
            usage.input,
            usage.output,
            usage.cache_read,
            usage.cache_write,
            usage.total_tokens
        ],
        [100, 40, 2000, 500, 2640]
    );
    assert!(close(usage.cost.cache_read, 2000.0 * 0.30 / 1e6));
    assert!(close(usage.cost.cache_write, 500.0 * 3.75 / 1e6));
    assert!(close(usage.cost.input, 100.0 * 3.0 / 1e6));
}

#[test]
fn usage_adds_up_across_responses() {
    let mut total = Usage::default();
    for _ in 0..3 {
        let events = decode_events(&openai_model(), &sse::openai_text_events(&["a", "b"]));
        total += final_message(&events).usage;
    }
    assert_eq!((total.input, total.output, total.total_tokens), (30, 6, 36));
}

/// llama-cpp-python repeats the id, type and name in every tool delta, sends explicit
/// nulls, and a legacy `function_call` beside `tool_calls`.
#[test]
fn repeated_ids_nulls_and_legacy_function_calls_make_one_call() {
    let piece = |args: &str| {
        sse::openai_delta(json!({
            "role": null, "content": null,
            "function_call": {"name": "add", "arguments": args},
            "tool_calls": [{"index": 0, "id": "call_7", "type": "function", "function": {"name": "add", "arguments": args}}]
        }))
    };
    let events = decode_events(
        &Model::openai_compatible("http://local/v1", "smollm2"),
        &[
            piece("{\"a\": "),
            piece("1, \"b\""),
            piece(": 2}"),
            sse::openai_finish("tool_calls"),
            sse::OPENAI_DONE.to_owned(),
        ],
    );
    let message = final_message(&events);
    let calls: Vec<_> = message.tool_calls().collect();
    assert_eq!(calls.len(), 1);
    assert_eq!(
        (calls[0].id.as_str(), calls[0].name.as_str()),
        ("call_7", "add")
    );
    assert_eq!(calls[0].arguments, json!({"a": 1, "b": 2}));
    assert_eq!(message.stop_reason, StopReason::ToolUse);
}

#[test]
fn a_legacy_function_call_alone_is_a_tool_call() {
    let events = decode_events(
        &Model::openai_compatible("http://local/v1", "m"),
        &[
            sse::openai_delta(json!({"function_call": {"name": "lookup", "arguments": "{\"q\":"}})),
            sse::openai_delta(json!({"function_call": {"arguments": "\"x\"}"}})),
            sse::openai_finish("function_call"),
            sse::OPENAI_DONE.to_owned(),
        ],
    );
    let message = final_message(&events);
    let call = message.tool_calls().next().unwrap();
    assert_eq!(
        (call.name.as_str(), &call.arguments),
        ("lookup", &json!({"q": "x"}))
    );
    // Sent without an id, it gets one of its own, unlike any other response's.
    let again = decode_events(
        &Model::openai_compatible("http://local/v1", "m"),
        &[
            sse::openai_delta(json!({"function_call": {"name": "lookup", "arguments": "{}"}})),
            sse::openai_finish("function_call"),
            sse::OPENAI_DONE.to_owned(),
        ],
    );
    let other = final_message(&again).tool_calls().next().unwrap();
    assert_eq!(call.id.len(), 36, "{}", call.id);
    assert_ne!(call.id, other.id);
}

#[test]
fn reasoning_fields_of_compatible_servers_are_thinking() {
    let events = decode_events(
        &Model::openai_compatible("http://local/v1", "m"),
        &[
            sse::openai_delta(json!({"reasoning": "Let me "})),
            sse::openai_delta(json!({"reasoning": "think."})),
            sse::openai_delta(json!({"content": "Answer."})),
            sse::openai_finish("stop"),
            sse::OPENAI_DONE.to_owned(),
        ],
    );
    let message = final_message(&events);
    assert!(
        matches!(&message.content[0], tiller_ai::AssistantContent::Thinking(t) if t.thinking == "Let me think.")
    );
    assert_eq!(message.text(), "Answer.");
}

#[test]
fn finish_reasons_map_to_stop_reasons_or_errors() {
    let finish = |reason: &str| {
        decode_events(
            &openai_model(),
            &[
                sse::openai_delta(json!({"content": "x"})),
                sse::openai_finish(reason),
                sse::OPENAI_DONE.to_owned(),
            ],
        )
    };
    assert_eq!(
        final_message(&finish("length")).stop_reason,
        StopReason::Length
    );
    assert_eq!(
        terminal_error(&finish("content_filter")),
        Some(&StreamError::ContentFiltered)
    );
    assert_eq!(
        terminal_error(&finish("mystery")),
        Some(&StreamError::UnknownStopReason {
            reason: "mystery".into()
        })
    );
    let events = decode_events(
        &openai_model(),
        &[
            sse::openai_delta(json!({"content": "x"})),
            sse::openai_finish("stop"),
        ],
    );
    assert_eq!(
        final_message(&events).stop_reason,
        StopReason::Stop,
        "a stream without [DONE] still ends"
    );
}

fn anthropic_events(
    stop_reason: &str,
    block: serde_json::Value,
    deltas: &[serde_json::Value],
) -> Vec<String> {
    let mut events = vec![
        sse::named(
            "message_start",
            &json!({"type": "message_start", "message": {"usage": {"input_tokens": 5, "output_tokens": 1}}}),
        ),
        sse::named(
            "content_block_start",
            &json!({"type": "content_block_start", "index": 0, "content_block": block}),
        ),
    ];
    events.extend(deltas.iter().map(|delta| {
        sse::named(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": 0, "delta": delta}),
        )
    }));
    events.push(sse::named(
        "content_block_stop",
        &json!({"type": "content_block_stop", "index": 0}),
    ));
    events.push(sse::named("message_delta", &json!({"type": "message_delta", "delta": {"stop_reason": stop_reason}, "usage": {"output_tokens": 9}})));
    events.push(sse::named("message_stop", &json!({"type": "message_stop"})));
    events
}

#[test]
fn anthropic_stop_reasons() {
    let text = json!({"type": "text", "text": ""});
    let said = [json!({"type": "text_delta", "text": "I can't help with that."})];
    for (reason, stop) in [
        ("end_turn", StopReason::Stop),
        ("pause_turn", StopReason::Stop),
        ("stop_sequence", StopReason::Stop),
        ("max_tokens", StopReason::Length),
    ] {
        let events = decode_events(
            &anthropic_model(),
            &anthropic_events(reason, text.clone(), &said),
        );
        assert_eq!(final_message(&events).stop_reason, stop, "{reason}");
    }
    let events = decode_events(
        &anthropic_model(),
        &anthropic_events("refusal", text, &said),
    );
    assert_eq!(
        terminal_error(&events),
        Some(&StreamError::Refused {
            message: "I can't help with that.".into()
        })
    );
}

#[test]
fn anthropic_tool_input_cut_by_max_tokens_is_truncated() {
    let events = decode_events(
        &anthropic_model(),
        &anthropic_events(
            "max_tokens",
            json!({"type": "tool_use", "id": "toolu_1", "name": "write", "input": {}}),
            &[
                json!({"type": "input_json_delta", "partial_json": "{\"path\": \"a.txt\", \"body\": \"Once"}),
            ],
        ),
    );
    let message = final_message(&events);
    assert_eq!(message.stop_reason, StopReason::Length);
    let call = message.tool_calls().next().unwrap();
    assert_eq!(
        call.arguments_error,
        Some(ArgumentsError::Truncated {
            received: "{\"path\": \"a.txt\", \"body\": \"Once".into()
        })
    );
}

#[test]
fn unescaped_control_characters_in_arguments_are_repaired() {
    let events = decode_events(
        &openai_model(),
        &[
            sse::openai_delta(
                json!({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "write", "arguments": "{\"code\": \"line one\n\tline two\"}"}}]}),
            ),
            sse::openai_finish("tool_calls"),
            sse::OPENAI_DONE.to_owned(),
        ],
    );
    let call = final_message(&events).tool_calls().next().unwrap().clone();
    assert_eq!(
        (call.arguments, call.arguments_error),
        (json!({"code": "line one\n\tline two"}), None)
    );
}

#[test]
fn complete_but_invalid_arguments_are_malformed() {
    let events = decode_events(
        &openai_model(),
        &[
            sse::openai_delta(
                json!({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "f", "arguments": "{\"a\": 1,,}"}}]}),
            ),
            sse::openai_finish("tool_calls"),
            sse::OPENAI_DONE.to_owned(),
        ],
    );
    let call = final_message(&events).tool_calls().next().unwrap();
    assert_eq!(call.arguments, json!({}));
    assert!(
        matches!(&call.arguments_error, Some(ArgumentsError::Malformed { received, .. }) if received == "{\"a\": 1,,}"),
        "{call:?}"
    );
}

#[test]
fn the_partial_message_shows_arguments_as_they_stream() {
    let mut decoder = ResponseDecoder::new(&openai_model()).unwrap();
    decoder.feed(sse::openai_delta(json!({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "weather", "arguments": "{\"city\": \"Tok"}}]})).as_bytes());
    let call = decoder.message().tool_calls().next().unwrap();
    assert_eq!(call.arguments, json!({"city": "Tok"}));
    decoder.feed(
        sse::openai_delta(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "yo\", \"days\": 3"}}]}),
        )
        .as_bytes(),
    );
    let call = decoder.message().tool_calls().next().unwrap();
    assert_eq!(call.arguments, json!({"city": "Tokyo", "days": 3}));
}

#[test]
fn anthropic_events_without_names_still_decode() {
    let named = anthropic_events(
        "end_turn",
        json!({"type": "text", "text": ""}),
        &[json!({"type": "text_delta", "text": "hi"})],
    );
    let unnamed: Vec<String> = named
        .iter()
        .map(|event| {
            event
                .lines()
                .filter(|l| !l.starts_with("event:"))
                .collect::<Vec<_>>()
                .join("\n")
                + "\n\n"
        })
        .collect();
    let events = decode_events(&anthropic_model(), &unnamed);
    assert_eq!(final_message(&events).text(), "hi");
}

/// A block index started twice ends its first block before the second starts: no
/// block is left open when the response ends (found by the property test).
#[test]
fn a_repeated_block_index_ends_the_block_it_had() {
    let start = json!({"type": "content_block_start", "index": 3, "content_block": {"type": "tool_use", "id": "t", "name": "n", "input": {}}});
    let events = [
        sse::named("content_block_start", &start),
        sse::named("content_block_start", &start),
        sse::named(
            "message_delta",
            &json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 18}}),
        ),
    ];
    let decoded = decode_events(&anthropic_model(), &events);
    let ends = decoded
        .iter()
        .filter(|event| matches!(event, AssistantEvent::ToolCallEnd { .. }))
        .count();
    assert_eq!(ends, 2, "{decoded:#?}");
    assert!(matches!(decoded.last(), Some(AssistantEvent::Done { .. })));
}

/// A consumer that applies each event to a `PartialMessage` holds exactly the
/// message the stream built, before the terminal event hands it over.
#[test]
fn applying_the_events_rebuilds_every_recorded_message() {
    for cassette in Cassette::all() {
        for exchange in cassette
            .exchanges
            .iter()
            .filter(|e| e.is_streaming_chat() && e.response.status == 200)
        {
            let model = model_for(&cassette, &exchange.request.body, "http://unused/v1");
            let events = decode(&model, &exchange.response.bytes(), &[7]);
            let AssistantEvent::Start { message } = &events[0] else {
                panic!("start first")
            };
            let mut partial = PartialMessage::new((**message).clone());
            for event in &events[1..events.len() - 1] {
                partial.apply(event);
            }
            assert_eq!(
                partial.message().content,
                final_message(&events).content,
                "{}",
                cassette.name
            );
        }
    }
}
