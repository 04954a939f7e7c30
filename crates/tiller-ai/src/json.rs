//! Tool-call arguments as they stream: a best-effort view of incomplete JSON, a
//! strict parse of the complete text, and the one repair providers really need
//! (control characters left unescaped inside strings).

use jiter::{JsonValue, PartialMode};
use serde_json::{Map, Number, Value};

/// The best-effort value of an incomplete JSON document: closed containers and
/// finished values as they stand, a trailing string as far as it got. `None` when
/// the text is not the start of any JSON value.
pub(crate) fn parse_partial(text: &str) -> Option<Value> {
    if text.trim().is_empty() {
        return Some(Value::Object(Map::new()));
    }
    let parse = |bytes: &[u8]| {
        JsonValue::parse_with_config(bytes, false, PartialMode::TrailingStrings)
            .ok()
            .map(|value| to_serde(&value))
    };
    parse(text.as_bytes()).or_else(|| parse(escape_control_chars(text)?.as_bytes()))
}

/// The value of a complete JSON document: empty text is an empty object (how
/// providers stream a call without arguments), and unescaped control characters
/// inside strings are repaired. The error is the parser's message.
pub(crate) fn parse_complete(text: &str) -> Result<Value, String> {
    if text.trim().is_empty() {
        return Ok(Value::Object(Map::new()));
    }
    serde_json::from_str(text).or_else(|error| {
        escape_control_chars(text)
            .and_then(|repaired| serde_json::from_str(&repaired).ok())
            .ok_or_else(|| error.to_string())
    })
}

/// Escapes raw control characters inside JSON strings. `None` when there were none,
/// so the caller need not parse the same text twice.
pub(crate) fn escape_control_chars(text: &str) -> Option<String> {
    let mut repaired: Option<String> = None;
    let mut in_string = false;
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        let needs_escape = in_string && (c as u32) < 0x20;
        if needs_escape && repaired.is_none() {
            let mut out = String::with_capacity(text.len() + 8);
            out.push_str(&text[..i]);
            repaired = Some(out);
        }
        if let Some(out) = repaired.as_mut() {
            if needs_escape {
                match c {
                    '\n' => out.push_str("\\n"),
                    '\r' => out.push_str("\\r"),
                    '\t' => out.push_str("\\t"),
                    '\u{8}' => out.push_str("\\b"),
                    '\u{c}' => out.push_str("\\f"),
                    other => out.push_str(&format!("\\u{:04x}", other as u32)),
                }
            } else {
                out.push(c);
            }
        }
        if needs_escape || escaped {
            escaped = false;
        } else if c == '\\' && in_string {
            escaped = true;
        } else if c == '"' {
            in_string = !in_string;
        }
    }
    repaired
}

fn to_serde(value: &JsonValue<'_>) -> Value {
    match value {
        JsonValue::Null => Value::Null,
        JsonValue::Bool(b) => Value::Bool(*b),
        JsonValue::Int(i) => Value::Number((*i).into()),
        JsonValue::Float(f) => Number::from_f64(*f).map_or(Value::Null, Value::Number),
        JsonValue::Str(s) => Value::String(s.to_string()),
        JsonValue::Array(items) => Value::Array(items.iter().map(to_serde).collect()),
        JsonValue::Object(fields) => Value::Object(
            fields
                .iter()
                .map(|(key, value)| (key.to_string(), to_serde(value)))
                .collect(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn partial_views_of_growing_arguments() {
        assert_eq!(parse_partial(""), Some(json!({})));
        assert_eq!(parse_partial("{\"city\": \"T"), Some(json!({"city": "T"})));
        assert_eq!(
            parse_partial("{\"city\": \"Tokyo\", \"n\": 1"),
            Some(json!({"city": "Tokyo", "n": 1}))
        );
        assert_eq!(
            parse_partial("{\"values\": [3, 5"),
            Some(json!({"values": [3, 5]}))
        );
        assert_eq!(
            parse_partial("{\"text\": \"a\nb"),
            Some(json!({"text": "a\nb"}))
        );
        assert_eq!(parse_partial("not json"), None);
    }

    #[test]
    fn complete_arguments_are_parsed_strictly_with_repair() {
        assert_eq!(parse_complete(""), Ok(json!({})));
        assert_eq!(parse_complete("  "), Ok(json!({})));
        assert_eq!(
            parse_complete("{\"a\": [1, {\"b\": null}]}"),
            Ok(json!({"a": [1, {"b": null}]}))
        );
        assert_eq!(
            parse_complete("{\"code\": \"line one\n\tline two\"}"),
            Ok(json!({"code": "line one\n\tline two"}))
        );
        assert!(parse_complete("{\"summary\": \"The cache warmer raced").is_err());
        assert!(parse_complete("{\"a\": 1} trailing").is_err());
    }

    #[test]
    fn repair_leaves_escapes_and_text_outside_strings_alone() {
        assert_eq!(escape_control_chars("{\"a\": \"x\\\"y\"}\n"), None);
        assert_eq!(
            escape_control_chars("{\"a\": \"x\\\"\u{1}\"}").as_deref(),
            Some("{\"a\": \"x\\\"\\u0001\"}")
        );
        assert_eq!(
            escape_control_chars("{\n\"a\": \"caf\u{e9}\r\"}").as_deref(),
            Some("{\n\"a\": \"caf\u{e9}\\r\"}")
        );
    }
}
