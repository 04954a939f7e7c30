//! Whatever bytes arrive, in whatever splits, with whatever numbers in them, a
//! decoded stream is well formed: a start, blocks that open before they grow and
//! close once, and exactly one terminal event (a message or a typed error), last.

#![allow(clippy::unwrap_used)]

mod common;

use common::{assert_well_formed, decode, dialect};
use proptest::prelude::*;
use tiller_ai::{Api, Model};
use tiller_test_support::Cassette;

/// A model of each dialect: OpenAI chat, Anthropic, Gemini, OpenAI Responses,
/// Bedrock.
fn models() -> [Model; 5] {
    [
        Model::openai_compatible("http://unused/v1", "m"),
        Model::anthropic_compatible("http://unused/v1", "m"),
        Model::speaking(Api::GoogleGenerativeAi, "http://unused/v1beta", "m"),
        Model::speaking(Api::OpenAiResponses, "http://unused/v1", "m"),
        Model::speaking(Api::BedrockConverseStream, "http://unused", "m"),
    ]
}

/// Every recorded 200 body in text (the binary event streams have their own
/// target in the fuzzer), with its dialect's model.
fn recorded() -> Vec<(Model, String)> {
    let [openai, anthropic, gemini, responses, _] = models();
    Cassette::all()
        .iter()
        .flat_map(|cassette| {
            let model = match dialect(cassette) {
                "anthropic" => anthropic.clone(),
                "gemini" => gemini.clone(),
                "openai-responses" => responses.clone(),
                _ => openai.clone(),
            };
            cassette
                .exchanges
                .iter()
                .filter(|e| e.is_streaming_chat() && e.response.status == 200)
                .filter(|e| e.response.body_encoding.is_none())
                .map(move |e| (model.clone(), e.response.body.clone()))
        })
        .collect()
}

/// Numbers that have broken decoders before.
fn odd_number() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<u64>().prop_map(|n| n.to_string()),
        Just("1099511627776".to_owned()),
        Just("18446744073709551616".to_owned()),
        Just("1e20".to_owned()),
        Just("1e300".to_owned()),
        Just("-1".to_owned()),
        Just("0.5".to_owned()),
    ]
}

/// `body` with its `n`-th runs of digits (cycling through `numbers`) replaced.
fn with_numbers(body: &str, numbers: &[String]) -> String {
    let mut out = String::with_capacity(body.len());
    let mut chars = body.chars().peekable();
    let mut next = numbers.iter().cycle();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            while chars.peek().is_some_and(char::is_ascii_digit) {
                chars.next();
            }
            out.push_str(next.next().map_or("0", String::as_str));
        } else {
            out.push(c);
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_bytes_in_random_splits_end_in_one_terminal_event(
        bytes in prop::collection::vec(any::<u8>(), 0..2048),
        sizes in prop::collection::vec(1usize..300, 1..16),
        dialect in 0usize..5,
    ) {
        let model = &models()[dialect];
        assert_well_formed(&decode(model, &bytes, &sizes));
    }

    #[test]
    fn random_event_streams_end_in_one_terminal_event(
        lines in prop::collection::vec(prop_oneof![
            Just("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}".to_owned()),
            Just("data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":7,\"id\":\"c\",\"function\":{\"name\":\"t\",\"arguments\":\"{\\\"a\\\":\"}}]}}]}".to_owned()),
            Just("event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":3,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"n\",\"input\":{}}}".to_owned()),
            Just("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":3,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"x\\\"\"}}".to_owned()),
            Just("event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\"},\"usage\":{\"output_tokens\":18446744073709551615}}".to_owned()),
            Just("data: [DONE]".to_owned()),
            Just("data: {\"candidates\":[{\"index\":0,\"content\":{\"parts\":[{\"text\":\"a\",\"thought\":true},{\"functionCall\":{\"name\":\"t\",\"args\":{\"x\":1}},\"thoughtSignature\":\"s\"},{\"text\":\"\",\"thoughtSignature\":\"s\"}]}}]}".to_owned()),
            Just("data: {\"candidates\":[{\"index\":0,\"finishReason\":\"STOP\"}],\"usageMetadata\":{\"promptTokenCount\":18446744073709551615,\"thoughtsTokenCount\":18446744073709551615}}".to_owned()),
            Just("data: {\"type\":\"response.output_item.added\",\"output_index\":1,\"item\":{\"type\":\"function_call\",\"call_id\":\"c\",\"name\":\"t\",\"arguments\":\"\"}}".to_owned()),
            Just("data: {\"type\":\"response.function_call_arguments.delta\",\"output_index\":1,\"delta\":\"{\\\"a\\\":\"}".to_owned()),
            Just("data: {\"type\":\"response.output_item.added\",\"output_index\":0,\"item\":{\"type\":\"reasoning\",\"id\":\"rs\"}}".to_owned()),
            Just("data: {\"type\":\"response.content_part.added\",\"output_index\":2,\"content_index\":0,\"part\":{\"type\":\"output_text\"}}".to_owned()),
            Just("data: {\"type\":\"response.output_text.delta\",\"output_index\":2,\"content_index\":0,\"delta\":\"a\"}".to_owned()),
            Just("data: {\"type\":\"response.incomplete\",\"response\":{\"incomplete_details\":{\"reason\":\"max_output_tokens\"},\"usage\":{\"input_tokens\":18446744073709551615}}}".to_owned()),
            Just(": keep-alive".to_owned()),
            Just(String::new()),
            "[ -~]{0,40}",
        ], 0..40),
        dialect in 0usize..5,
    ) {
        let body = lines.join("\n");
        let model = &models()[dialect];
        assert_well_formed(&decode(model, body.as_bytes(), &[usize::MAX]));
    }
}

#[test]
fn recorded_bodies_with_huge_numbers_end_in_one_terminal_event() {
    let streams = recorded();
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(512));
    let strategy = (0..streams.len(), prop::collection::vec(odd_number(), 1..8));
    runner
        .run(&strategy, |(index, numbers)| {
            let (model, body) = &streams[index];
            let body = with_numbers(body, &numbers);
            assert_well_formed(&decode(model, body.as_bytes(), &[usize::MAX]));
            Ok(())
        })
        .unwrap();
}
