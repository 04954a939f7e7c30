//! Files in messages on each dialect's wire: a PDF asked about, sent over real HTTP
//! to a loopback server, must arrive in the provider's documented form exactly;
//! a file a provider does not take is refused, naming it, before anything is sent.

#![allow(clippy::unwrap_used)]

mod common;

use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tiller_ai::{
    Context, FileContent, Message, Model, StreamError, ToolCall, ToolResultMessage, UserMessage,
};
use tiller_test_support::{MockResponse, MockServer, sse};

const PDF: &[u8] = include_bytes!("../../../examples/files/report.pdf");

fn pdf() -> FileContent {
    FileContent::from_bytes("report.pdf", PDF).unwrap()
}

fn asked(file: FileContent) -> Context {
    Context::new().with_message(UserMessage::text("What does the report say?").with_file(file))
}

/// The body of the one request `model` sends for `context`.
async fn sent(model: fn(&MockServer) -> Model, context: &Context) -> Value {
    let server = MockServer::start().await;
    server.push(MockResponse::sse(sse::openai_text(&["ok"])));
    let model = model(&server);
    common::run_to_end(&model, context, &common::options()).await;
    server.requests().remove(0).body
}

/// What `model` answers for `context` without sending it, and that nothing was sent.
async fn refused(model: fn(&MockServer) -> Model, context: &Context) -> StreamError {
    let server = MockServer::start().await;
    let (_, error) = common::run_to_end(&model(&server), context, &common::options()).await;
    assert!(server.requests().is_empty(), "a refused request was sent");
    error.unwrap()
}

fn pdf_base64() -> String {
    pdf().data
}

#[tokio::test]
async fn openai_chat_sends_a_file_part_with_a_data_url() {
    let body = sent(common::openai, &asked(pdf())).await;
    assert_eq!(
        body["messages"][0],
        json!({
            "role": "user",
            "content": [
                {"type": "text", "text": "What does the report say?"},
                {"type": "file", "file": {
                    "filename": "report.pdf",
                    "file_data": format!("data:application/pdf;base64,{}", pdf_base64()),
                }},
            ],
        })
    );
}

#[tokio::test]
async fn openai_chat_sends_wav_as_input_audio_and_refuses_other_audio() {
    let wav = FileContent::from_bytes("hello.wav", b"RIFF....WAVEfmt ").unwrap();
    let body = sent(common::openai, &asked(wav.clone())).await;
    assert_eq!(
        body["messages"][0]["content"][1],
        json!({"type": "input_audio", "input_audio": {"data": wav.data, "format": "wav"}})
    );
    let notes = FileContent::from_bytes("notes.txt", b"hi").unwrap();
    assert_eq!(
        refused(common::openai, &asked(notes)).await,
        StreamError::UnsupportedFile {
            provider: "openai".into(),
            mime_type: "text/plain".into(),
            in_tool_result: false,
        }
    );
    let flac = FileContent::from_bytes("hello.flac", b"fLaC").unwrap();
    assert_eq!(
        refused(common::openai, &asked(flac)).await,
        StreamError::UnsupportedFile {
            provider: "openai".into(),
            mime_type: "audio/flac".into(),
            in_tool_result: false,
        }
    );
}

#[tokio::test]
async fn responses_sends_an_input_file() {
    let body = sent(common::responses, &asked(pdf())).await;
    assert_eq!(
        body["input"][0],
        json!({
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "What does the report say?"},
                {
                    "type": "input_file",
                    "filename": "report.pdf",
                    "file_data": format!("data:application/pdf;base64,{}", pdf_base64()),
                },
            ],
        })
    );
}

#[tokio::test]
async fn anthropic_sends_a_document_block() {
    let body = sent(common::anthropic, &asked(pdf())).await;
    assert_eq!(
        body["messages"][0],
        json!({
            "role": "user",
            "content": [
                {"type": "text", "text": "What does the report say?"},
                {
                    "type": "document",
                    "source": {
                        "type": "base64",
                        "media_type": "application/pdf",
                        "data": pdf_base64(),
                    },
                    "title": "report.pdf",
                    "cache_control": {"type": "ephemeral"},
                },
            ],
        })
    );
    let notes = FileContent::from_bytes("notes.txt", "Grüße".as_bytes()).unwrap();
    let body = sent(common::anthropic, &asked(notes)).await;
    assert_eq!(
        body["messages"][0]["content"][1]["source"],
        json!({"type": "text", "media_type": "text/plain", "data": "Grüße"})
    );
    let table = FileContent::from_bytes("table.csv", b"a,b").unwrap();
    let body = sent(common::anthropic, &asked(table)).await;
    assert_eq!(
        body["messages"][0]["content"][1]["source"],
        json!({"type": "text", "media_type": "text/plain", "data": "a,b"})
    );
}

#[tokio::test]
async fn gemini_sends_inline_data() {
    let body = sent(common::gemini, &asked(pdf())).await;
    assert_eq!(
        body["contents"][0],
        json!({
            "role": "user",
            "parts": [
                {"text": "What does the report say?"},
                {"inlineData": {"mimeType": "application/pdf", "data": pdf_base64()}},
            ],
        })
    );
}

#[tokio::test]
async fn bedrock_sends_a_document_named_as_converse_allows() {
    let file = FileContent::from_bytes("Q3 report.v2.pdf", PDF).unwrap();
    let csv = FileContent::from_bytes("Q3 report.v2.csv", b"a,b").unwrap();
    let accented = FileContent::from_bytes("Ärger.txt", b"x").unwrap();
    let context = Context::new().with_message(
        UserMessage::text("What does the report say?")
            .with_file(file)
            .with_file(csv.clone())
            .with_file(accented),
    );
    let body = sent(common::bedrock, &context).await;
    assert_eq!(
        body["messages"][0],
        json!({
            "role": "user",
            "content": [
                {"text": "What does the report say?"},
                {"document": {
                    "format": "pdf",
                    "name": "Q3 report-v2",
                    "source": {"bytes": pdf_base64()},
                }},
                // Converse refuses two documents of one name in a request.
                {"document": {
                    "format": "csv",
                    "name": "Q3 report-v2-2",
                    "source": {"bytes": csv.data},
                }},
                {"document": {
                    "format": "txt",
                    "name": "-rger",
                    "source": {"bytes": "eA=="},
                }},
            ],
        })
    );
}

#[tokio::test]
async fn a_file_a_provider_does_not_take_is_refused_by_name_before_sending() {
    let wav = || FileContent::from_bytes("hello.wav", b"RIFF").unwrap();
    let unsupported =
        |provider: &str, mime_type: &str, in_tool_result| StreamError::UnsupportedFile {
            provider: provider.into(),
            mime_type: mime_type.into(),
            in_tool_result,
        };
    assert_eq!(
        refused(common::anthropic, &asked(wav())).await,
        unsupported("anthropic", "audio/wav", false)
    );
    assert_eq!(
        refused(common::responses, &asked(wav())).await,
        unsupported("openai-responses", "audio/wav", false)
    );
    assert_eq!(
        refused(common::bedrock, &asked(wav())).await,
        unsupported("bedrock", "audio/wav", false)
    );
    let docx = FileContent::from_bytes("letter.docx", b"PK").unwrap();
    assert_eq!(
        refused(common::gemini, &asked(docx)).await,
        unsupported(
            "gemini",
            "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
            false
        )
    );
    let pi = |server: &MockServer| Model::pi_proxy(server.origin(), "openai", "gpt-test");
    assert_eq!(
        refused(pi, &asked(pdf())).await,
        unsupported("openai", "application/pdf", false)
    );

    // OpenAI's tool messages carry only text: a tool's file is refused there.
    let call = ToolCall {
        id: "call_1".into(),
        name: "fetch".into(),
        arguments: json!({}),
        arguments_error: None,
        signature: None,
    };
    let mut result = ToolResultMessage::text(&call, "here it is", false);
    result.content.push(tiller_ai::Content::File(pdf()));
    let context = Context::new()
        .with_message(Message::user("Fetch it"))
        .with_message(result);
    assert_eq!(
        refused(common::openai, &context).await,
        unsupported("openai", "application/pdf", true)
    );
    // Anthropic takes it as a document in the tool result.
    let body = sent(common::anthropic, &context).await;
    let tool_result = body["messages"][0]["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|block| block["type"] == "tool_result")
        .unwrap();
    assert_eq!(tool_result["content"][1]["type"], "document");
}

#[test]
fn the_error_names_the_provider_and_the_type() {
    let error = StreamError::UnsupportedFile {
        provider: "anthropic".into(),
        mime_type: "audio/wav".into(),
        in_tool_result: false,
    };
    assert_eq!(error.to_string(), "anthropic does not take audio/wav files");
}
