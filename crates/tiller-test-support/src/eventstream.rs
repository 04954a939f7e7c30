//! AWS event-stream messages as Bedrock's `converse-stream` writes them, encoded by
//! `aws-smithy-eventstream` (with real CRCs), for scripted Bedrock responses.

use aws_smithy_eventstream::frame::write_message_to;
use aws_smithy_types::event_stream::{Header, HeaderValue, Message};
use serde_json::Value;

use crate::server::MockResponse;

fn encode(headers: [(&'static str, String); 3], payload: &Value) -> Vec<u8> {
    let mut message = Message::new(payload.to_string().into_bytes());
    for (name, value) in headers {
        message = message.add_header(Header::new(name, HeaderValue::String(value.into())));
    }
    let mut bytes = Vec::new();
    write_message_to(&message, &mut bytes).unwrap();
    bytes
}

/// An event message named `event_type` carrying `payload`.
pub fn event(event_type: &str, payload: &Value) -> Vec<u8> {
    encode(
        [
            (":event-type", event_type.to_owned()),
            (":content-type", "application/json".to_owned()),
            (":message-type", "event".to_owned()),
        ],
        payload,
    )
}

/// An exception message of `kind` (`throttlingException`, say) saying `message`.
pub fn exception(kind: &str, message: &str) -> Vec<u8> {
    encode(
        [
            (":exception-type", kind.to_owned()),
            (":content-type", "application/json".to_owned()),
            (":message-type", "exception".to_owned()),
        ],
        &serde_json::json!({ "message": message }),
    )
}

/// A `200` whose body is `messages`, as Bedrock sends them.
pub fn response(messages: impl IntoIterator<Item = Vec<u8>>) -> MockResponse {
    MockResponse::recorded(
        200,
        "application/vnd.amazon.eventstream",
        messages.into_iter().flatten().collect::<Vec<u8>>(),
    )
}
