//! Tool arguments against their JSON Schema: scalars the model sent as the wrong
//! JSON type are coerced first (`"5"` for an integer, `"true"` for a boolean, a
//! number for a string), as most agent runtimes do; whatever still fails the schema
//! is reported to the model as `path: message` lines with the arguments received.

use serde_json::{Map, Number, Value};

/// Coerces scalar values toward the types `schema` declares, in place, following
/// `properties`, `additionalProperties` and `items`.
pub(crate) fn coerce(schema: &Value, value: &mut Value) {
    let Some(schema) = schema.as_object() else {
        return;
    };
    if let Some(coerced) = coerce_scalar(schema, value) {
        *value = coerced;
    }
    match value {
        Value::Object(fields) => coerce_fields(schema, fields),
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for item in items {
                    coerce(item_schema, item);
                }
            }
        }
        _ => {}
    }
}

fn coerce_fields(schema: &Map<String, Value>, fields: &mut Map<String, Value>) {
    let properties = schema.get("properties").and_then(Value::as_object);
    let additional = schema.get("additionalProperties").filter(|s| s.is_object());
    for (key, field) in fields.iter_mut() {
        if let Some(field_schema) = properties.and_then(|p| p.get(key)).or(additional) {
            coerce(field_schema, field);
        }
    }
}

/// The value converted to one of the schema's types, when it has none of them and
/// a lossless reading exists.
fn coerce_scalar(schema: &Map<String, Value>, value: &Value) -> Option<Value> {
    let types: Vec<&str> = match schema.get("type")? {
        Value::String(kind) => vec![kind.as_str()],
        Value::Array(kinds) => kinds.iter().filter_map(Value::as_str).collect(),
        _ => return None,
    };
    if types.iter().any(|kind| has_type(value, kind)) {
        return None;
    }
    types.iter().find_map(|kind| convert(value, kind))
}

fn has_type(value: &Value, kind: &str) -> bool {
    match kind {
        "string" => value.is_string(),
        "number" => value.is_number(),
        "integer" => {
            value.as_i64().is_some()
                || value.as_u64().is_some()
                || value.as_f64().is_some_and(|f| f.fract() == 0.0)
        }
        "boolean" => value.is_boolean(),
        "null" => value.is_null(),
        "object" => value.is_object(),
        "array" => value.is_array(),
        _ => true,
    }
}

fn convert(value: &Value, kind: &str) -> Option<Value> {
    match (kind, value) {
        ("number" | "integer", Value::String(text)) => {
            let text = text.trim();
            if let Ok(int) = text.parse::<i64>() {
                return Some(Value::Number(int.into()));
            }
            let float = text.parse::<f64>().ok().filter(|f| f.is_finite())?;
            if kind == "integer" && float.fract() != 0.0 {
                return None;
            }
            Number::from_f64(float).map(Value::Number)
        }
        ("number" | "integer", Value::Bool(flag)) => Some(Value::Number(u8::from(*flag).into())),
        ("string", Value::Number(number)) => Some(Value::String(number.to_string())),
        ("string", Value::Bool(flag)) => Some(Value::String(flag.to_string())),
        ("boolean", Value::String(text)) => match text.trim() {
            "true" => Some(Value::Bool(true)),
            "false" => Some(Value::Bool(false)),
            _ => None,
        },
        ("boolean", Value::Number(number)) => match number.as_f64() {
            Some(1.0) => Some(Value::Bool(true)),
            Some(0.0) => Some(Value::Bool(false)),
            _ => None,
        },
        ("null", Value::String(text)) if text.is_empty() => Some(Value::Null),
        _ => None,
    }
}

/// Each way `args` fails `validator`, as `path: message`.
pub(crate) fn errors(validator: &jsonschema::Validator, args: &Value) -> Vec<String> {
    validator
        .iter_errors(args)
        .map(|error| {
            let path = error.instance_path().to_string();
            let path = if path.is_empty() {
                "root"
            } else {
                path.as_str()
            };
            format!("{path}: {error}")
        })
        .collect()
}

/// The error result the model reads when its arguments fail the schema.
pub(crate) fn failure_text(tool: &str, errors: &[String], received: &Value) -> String {
    let mut text = format!("Validation failed for tool \"{tool}\":\n");
    for error in errors {
        text.push_str("  - ");
        text.push_str(error);
        text.push('\n');
    }
    text.push_str("\nReceived arguments:\n");
    text.push_str(&serde_json::to_string_pretty(received).unwrap_or_else(|_| received.to_string()));
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn coerced(schema: Value, mut value: Value) -> Value {
        coerce(&schema, &mut value);
        value
    }

    #[test]
    fn scalars_are_coerced_to_the_declared_types() {
        let schema = json!({"type": "object", "properties": {
            "n": {"type": "integer"}, "x": {"type": "number"}, "s": {"type": "string"},
            "b": {"type": "boolean"}, "either": {"type": ["integer", "null"]},
            "list": {"type": "array", "items": {"type": "integer"}},
            "nested": {"type": "object", "properties": {"flag": {"type": "boolean"}}}
        }});
        assert_eq!(
            coerced(
                schema,
                json!({
                    "n": " 42 ", "x": "2.5", "s": 7, "b": "false", "either": "3",
                    "list": ["1", 2, "x"], "nested": {"flag": 1}, "other": "5"
                })
            ),
            json!({
                "n": 42, "x": 2.5, "s": "7", "b": false, "either": 3,
                "list": [1, 2, "x"], "nested": {"flag": true}, "other": "5"
            })
        );
    }

    #[test]
    fn lossy_readings_are_left_for_validation_to_reject() {
        let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}, "b": {"type": "boolean"}}});
        assert_eq!(
            coerced(schema, json!({"n": "2.5", "b": "yes"})),
            json!({"n": "2.5", "b": "yes"})
        );
    }

    #[test]
    fn failures_list_each_path_and_the_arguments() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "b"]});
        let validator = jsonschema::validator_for(&schema).unwrap();
        let args = json!({"a": "x"});
        let mut found = errors(&validator, &args);
        found.sort();
        assert_eq!(
            found,
            [
                "/a: \"x\" is not of type \"integer\"",
                "root: \"b\" is a required property"
            ]
        );
        assert_eq!(
            failure_text("add", &found, &args),
            "Validation failed for tool \"add\":\n  - /a: \"x\" is not of type \"integer\"\n  - root: \"b\" is a required property\n\nReceived arguments:\n{\n  \"a\": \"x\"\n}"
        );
    }
}
