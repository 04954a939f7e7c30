//! Writing a `streamGenerateContent` request.
//!
//! User messages and tool results are `user` turns, assistant messages `model`
//! turns; consecutive turns of one role merge, so the results of one response's
//! calls answer it in one turn, in order. A tool result is a `functionResponse`
//! (`{"output": …}`, or `{"error": …}` for a failed call) tied to its call by name
//! and id; its images and files follow it as inline data, as a user's files are
//! sent (PDFs, text and audio; other files refused). Text, thought text and function
//! calls from a Gemini response go back with their `thoughtSignature`s exactly as
//! received; thinking from another API is dropped, as Gemini would not take it.
//!
//! Tool schemas are converted to the OpenAPI subset `parameters` accepts:
//! a string `const` becomes a one-value `enum`, `oneOf` becomes `anyOf`, a type
//! list with `"null"` becomes `nullable`, local `$ref`s into `$defs`/`definitions`
//! are inlined (a cycle becomes a plain object), and what the subset lacks is
//! dropped: `additionalProperties`, `$schema`, `$id`, `allOf`, `not`,
//! `patternProperties`, `if`/`then`/`else`, exclusive bounds, enums of other than
//! strings, and formats other than `enum`, `date-time`, `int32`, `int64`, `float`
//! and `double`. A structured answer's
//! schema goes unconverted as `responseJsonSchema`, which takes JSON Schema.

use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::context::{ContextRef, Tool};
use crate::error::StreamError;
use crate::file::FileContent;
use crate::http::{self, HttpRequest};
use crate::message::{AssistantContent, Content, Message};
use crate::model::{Api, Model};
use crate::options::{StreamOptions, ThinkingLevel, ToolChoice};
use crate::providers::{check_files, path_segment};

/// The thought signature Google documents for a function call Gemini did not make.
const UNSIGNED_CALL: &str = "skip_thought_signature_validator";

/// How deep `$ref`s are inlined before a reference is left as a plain object.
const MAX_REF_DEPTH: usize = 8;

/// The schema keywords Gemini's `parameters` take as they are.
const KEPT_KEYWORDS: &[&str] = &[
    "type",
    "title",
    "description",
    "nullable",
    "maxItems",
    "minItems",
    "minProperties",
    "maxProperties",
    "minLength",
    "maxLength",
    "pattern",
    "example",
    "default",
    "minimum",
    "maximum",
    "propertyOrdering",
];

pub(crate) fn request(
    model: &Model,
    context: ContextRef<'_>,
    options: &StreamOptions,
) -> Result<HttpRequest, StreamError> {
    let auth =
        http::api_key(model, options)?.map(|key| ("x-goog-api-key", key.expose().to_owned()));
    check_files(model, context, |file, _| takes(file))?;
    let body = body(model, context, options);
    let path = format!(
        "models/{}:streamGenerateContent?alt=sse",
        path_segment(&model.id)
    );
    http::post_json(model, &path, &body, &[], auth, options)
}

fn body<'a>(model: &'a Model, context: ContextRef<'a>, options: &'a StreamOptions) -> Body<'a> {
    let gemini_3 = model.id.starts_with("gemini-3");
    let mut contents: Vec<Turn<'a>> = Vec::with_capacity(context.messages.len());
    for message in context.messages {
        let (role, parts) = match message {
            Message::User(user) => (
                "user",
                user.content.iter().filter_map(content_part).collect(),
            ),
            Message::Assistant(assistant) => {
                let own = assistant.api == Api::GoogleGenerativeAi;
                let parts = assistant
                    .content
                    .iter()
                    .filter_map(|block| assistant_part(block, own, gemini_3))
                    .collect();
                ("model", parts)
            }
            Message::ToolResult(result) => {
                let text = result.text_content();
                let response = if result.is_error {
                    json!({ "error": text })
                } else {
                    json!({ "output": text })
                };
                let mut parts = vec![Part {
                    function_response: Some(FunctionResponse {
                        id: &result.tool_call_id,
                        name: &result.tool_name,
                        response,
                    }),
                    ..Part::default()
                }];
                parts.extend(
                    result
                        .content
                        .iter()
                        .filter(|content| !matches!(content, Content::Text(_)))
                        .filter_map(content_part),
                );
                ("user", parts)
            }
        };
        push_turn(&mut contents, role, parts);
    }

    let system_instruction = context
        .system_prompt
        .filter(|prompt| !prompt.is_empty())
        .map(|text| SystemInstruction {
            parts: [TextPart { text }],
        });
    let tools = (!context.tools.is_empty()).then(|| {
        [Tools {
            function_declarations: context.tools.iter().map(declaration).collect(),
        }]
    });
    let tool_config = options
        .tool_choice
        .as_ref()
        .filter(|_| !context.tools.is_empty())
        .map(|choice| {
            let (mode, allowed) = match choice {
                ToolChoice::Auto => ("AUTO", None),
                ToolChoice::None => ("NONE", None),
                ToolChoice::Required => ("ANY", None),
                ToolChoice::Tool(name) => ("ANY", Some([name.as_str()])),
            };
            ToolConfig {
                function_calling_config: FunctionCallingConfig {
                    mode,
                    allowed_function_names: allowed,
                },
            }
        });
    let output = options.output_schema.as_ref();
    Body {
        contents,
        system_instruction,
        tools,
        tool_config,
        generation_config: GenerationConfig {
            temperature: options.temperature,
            max_output_tokens: options.max_tokens,
            thinking_config: thinking_config(model, options),
            response_mime_type: output.map(|_| "application/json"),
            response_json_schema: output.map(|output| &output.schema),
        },
    }
}

/// Gemini 3 takes a thinking level; earlier models a budget in tokens.
fn thinking_config(model: &Model, options: &StreamOptions) -> Option<ThinkingConfig> {
    if !model.reasoning || options.thinking == ThinkingLevel::Off {
        return None;
    }
    if model.id.starts_with("gemini-2") {
        let budget = options.thinking_budgets.for_level(options.thinking)?;
        return Some(ThinkingConfig {
            include_thoughts: true,
            thinking_budget: Some(budget),
            thinking_level: None,
        });
    }
    // Gemini 3 Pro thinks `low` or `high`; Flash also `minimal` and `medium`.
    let pro = model.id.contains("-pro");
    let level = match options.thinking {
        ThinkingLevel::Minimal if !pro => "minimal",
        ThinkingLevel::Minimal | ThinkingLevel::Low => "low",
        ThinkingLevel::Medium if !pro => "medium",
        ThinkingLevel::Off | ThinkingLevel::Medium | ThinkingLevel::High | ThinkingLevel::Xhigh => {
            "high"
        }
    };
    Some(ThinkingConfig {
        include_thoughts: true,
        thinking_budget: None,
        thinking_level: Some(level),
    })
}

fn push_turn<'a>(turns: &mut Vec<Turn<'a>>, role: &'static str, parts: Vec<Part<'a>>) {
    if parts.is_empty() {
        return;
    }
    match turns.last_mut() {
        Some(last) if last.role == role => last.parts.extend(parts),
        _ => turns.push(Turn { role, parts }),
    }
}

/// Whether Gemini takes the file: PDFs, text (code, CSV, HTML, Markdown, XML,
/// JSON, RTF) and the audio it lists (WAV, MP3, AIFF, AAC, OGG, FLAC).
fn takes(file: &FileContent) -> bool {
    let mime = file.mime_type.as_str();
    file.is_pdf()
        || mime.starts_with("text/")
        || matches!(
            mime,
            "application/json"
                | "application/rtf"
                | "application/x-javascript"
                | "application/x-python-code"
                | "application/x-typescript"
                | "audio/wav"
                | "audio/x-wav"
                | "audio/mp3"
                | "audio/mpeg"
                | "audio/aiff"
                | "audio/aac"
                | "audio/ogg"
                | "audio/flac"
        )
}

fn content_part(content: &Content) -> Option<Part<'_>> {
    match content {
        Content::Text(text) if text.text.is_empty() => None,
        Content::Text(text) => Some(Part {
            text: Some(&text.text),
            ..Part::default()
        }),
        Content::Image(image) => Some(Part {
            inline_data: Some(InlineData {
                mime_type: &image.mime_type,
                data: &image.data,
            }),
            ..Part::default()
        }),
        Content::File(file) => Some(Part {
            inline_data: Some(InlineData {
                mime_type: &file.mime_type,
                data: &file.data,
            }),
            ..Part::default()
        }),
    }
}

/// A block of an assistant message; `own` when Gemini wrote it, so its thinking
/// and signatures go back; `gemini_3` when the request is to a Gemini 3 model.
fn assistant_part(block: &AssistantContent, own: bool, gemini_3: bool) -> Option<Part<'_>> {
    match block {
        AssistantContent::Text(text) => {
            let signature = text.signature.as_deref().filter(|_| own);
            (!text.text.is_empty() || signature.is_some()).then_some(Part {
                text: Some(&text.text),
                thought_signature: signature,
                ..Part::default()
            })
        }
        AssistantContent::Thinking(thinking) if own && !thinking.redacted => Some(Part {
            text: Some(&thinking.thinking),
            thought: true,
            thought_signature: thinking.signature.as_deref(),
            ..Part::default()
        }),
        AssistantContent::Thinking(_) => None,
        AssistantContent::ToolCall(call) => Some(Part {
            function_call: Some(FunctionCall {
                id: &call.id,
                name: &call.name,
                args: &call.arguments,
            }),
            // Gemini 3 refuses a call without a signature; one it did not sign
            // (another model's) carries the placeholder Google documents for that.
            thought_signature: call
                .signature
                .as_deref()
                .filter(|_| own)
                .or_else(|| gemini_3.then_some(UNSIGNED_CALL)),
            ..Part::default()
        }),
    }
}

fn declaration(tool: &Tool) -> FunctionDeclaration<'_> {
    let defs = tool
        .parameters
        .get("$defs")
        .or_else(|| tool.parameters.get("definitions"))
        .and_then(Value::as_object);
    FunctionDeclaration {
        name: &tool.name,
        description: &tool.description,
        parameters: convert_schema(&tool.parameters, defs, 0),
    }
}

/// `schema` in the subset Gemini's `parameters` accept (see the module's docs).
fn convert_schema(schema: &Value, defs: Option<&Map<String, Value>>, depth: usize) -> Value {
    let Some(object) = schema.as_object() else {
        return json!({ "type": "object" });
    };
    if let Some(target) = object.get("$ref").and_then(Value::as_str) {
        let name = target
            .strip_prefix("#/$defs/")
            .or_else(|| target.strip_prefix("#/definitions/"));
        return match name.and_then(|name| defs?.get(name)) {
            Some(referenced) if depth < MAX_REF_DEPTH => {
                convert_schema(referenced, defs, depth + 1)
            }
            _ => json!({ "type": "object" }),
        };
    }
    let mut converted = Map::new();
    for (key, value) in object {
        match key.as_str() {
            "type" => match value {
                Value::Array(types) => {
                    let mut named = types.iter().filter(|t| t.as_str() != Some("null"));
                    if let Some(first) = named.next() {
                        converted.insert("type".to_owned(), first.clone());
                    }
                    if types.len() > 1 && types.iter().any(|t| t.as_str() == Some("null")) {
                        converted.insert("nullable".to_owned(), Value::Bool(true));
                    }
                }
                other => {
                    converted.insert("type".to_owned(), other.clone());
                }
            },
            // Gemini takes an enum of strings only.
            "const" if value.is_string() => {
                converted.insert("enum".to_owned(), Value::Array(vec![value.clone()]));
            }
            "enum"
                if value
                    .as_array()
                    .is_some_and(|v| v.iter().all(Value::is_string)) =>
            {
                converted.insert(key.clone(), value.clone());
            }
            // And these formats only.
            "format"
                if matches!(
                    value.as_str(),
                    Some("enum" | "date-time" | "int32" | "int64" | "float" | "double")
                ) =>
            {
                converted.insert(key.clone(), value.clone());
            }
            "properties" => {
                let properties = value
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(name, property)| (name.clone(), convert_schema(property, defs, depth)))
                    .collect();
                converted.insert(key.clone(), Value::Object(properties));
            }
            "items" => {
                converted.insert(key.clone(), convert_schema(value, defs, depth));
            }
            "anyOf" | "oneOf" => {
                let variants = value
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|variant| convert_schema(variant, defs, depth))
                    .collect();
                converted.insert("anyOf".to_owned(), Value::Array(variants));
            }
            "required" => {
                converted.insert(key.clone(), value.clone());
            }
            kept if KEPT_KEYWORDS.contains(&kept) => {
                converted.insert(key.clone(), value.clone());
            }
            _ => {}
        }
    }
    Value::Object(converted)
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Body<'a> {
    contents: Vec<Turn<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    system_instruction: Option<SystemInstruction<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<[Tools<'a>; 1]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_config: Option<ToolConfig<'a>>,
    generation_config: GenerationConfig<'a>,
}

#[derive(Serialize)]
struct Turn<'a> {
    role: &'static str,
    parts: Vec<Part<'a>>,
}

#[derive(Serialize)]
struct SystemInstruction<'a> {
    parts: [TextPart<'a>; 1],
}

#[derive(Serialize)]
struct TextPart<'a> {
    text: &'a str,
}

#[derive(Serialize, Default)]
#[serde(rename_all = "camelCase")]
struct Part<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<&'a str>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    thought: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    thought_signature: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    inline_data: Option<InlineData<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    function_call: Option<FunctionCall<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    function_response: Option<FunctionResponse<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct InlineData<'a> {
    mime_type: &'a str,
    data: &'a str,
}

#[derive(Serialize)]
struct FunctionCall<'a> {
    id: &'a str,
    name: &'a str,
    args: &'a Value,
}

#[derive(Serialize)]
struct FunctionResponse<'a> {
    id: &'a str,
    name: &'a str,
    response: Value,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Tools<'a> {
    function_declarations: Vec<FunctionDeclaration<'a>>,
}

#[derive(Serialize)]
struct FunctionDeclaration<'a> {
    name: &'a str,
    description: &'a str,
    parameters: Value,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ToolConfig<'a> {
    function_calling_config: FunctionCallingConfig<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct FunctionCallingConfig<'a> {
    mode: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    allowed_function_names: Option<[&'a str; 1]>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct GenerationConfig<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_output_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    thinking_config: Option<ThinkingConfig>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_mime_type: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_json_schema: Option<&'a Value>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ThinkingConfig {
    include_thoughts: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    thinking_budget: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    thinking_level: Option<&'static str>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemas_are_converted_to_the_subset_gemini_takes() {
        let schema = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "additionalProperties": false,
            "properties": {
                "mode": {"const": "fast"},
                "level": {"type": "integer", "const": 3, "format": "int32"},
                "site": {"type": "string", "format": "uri", "enum": ["a", "b"]},
                "note": {"type": ["string", "null"], "description": "optional"},
                "shape": {"oneOf": [{"$ref": "#/$defs/circle"}, {"type": "integer", "exclusiveMinimum": 0}]},
                "tree": {"$ref": "#/$defs/tree"}
            },
            "required": ["mode"],
            "$defs": {
                "circle": {"type": "object", "properties": {"r": {"type": "number"}}},
                "tree": {"type": "object", "properties": {"child": {"$ref": "#/$defs/tree"}}}
            }
        });
        let defs = schema.get("$defs").and_then(Value::as_object);
        let converted = convert_schema(&schema, defs, 0);
        assert_eq!(converted["properties"]["mode"], json!({"enum": ["fast"]}));
        assert_eq!(
            converted["properties"]["level"],
            json!({"type": "integer", "format": "int32"})
        );
        assert_eq!(
            converted["properties"]["site"],
            json!({"type": "string", "enum": ["a", "b"]})
        );
        assert_eq!(
            converted["properties"]["note"],
            json!({"type": "string", "nullable": true, "description": "optional"})
        );
        assert_eq!(
            converted["properties"]["shape"],
            json!({"anyOf": [{"type": "object", "properties": {"r": {"type": "number"}}}, {"type": "integer"}]})
        );
        assert_eq!(converted["required"], json!(["mode"]));
        for dropped in ["$schema", "additionalProperties", "$defs"] {
            assert!(converted.get(dropped).is_none(), "{dropped} kept");
        }
        // A cycle is cut after a few levels, as a plain object.
        let mut tree = &converted["properties"]["tree"];
        let mut depth = 0;
        while let Some(child) = tree["properties"].get("child") {
            tree = child;
            depth += 1;
        }
        assert_eq!((depth, tree), (MAX_REF_DEPTH, &json!({"type": "object"})));
    }
}
