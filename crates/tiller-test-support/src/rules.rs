//! The transcript rules a provider holds a request to, checked on every request the
//! [`MockServer`](crate::MockServer) receives: each tool result follows its call,
//! every call is answered before the conversation goes on, and, for Anthropic's
//! messages and Gemini's contents, the roles alternate and start with the user. A
//! request that breaks them is answered `400`, as a provider would, and recorded.

use std::collections::BTreeSet;

use serde_json::Value;

/// Why the request to `path` with `body` breaks the transcript rules, if it does.
/// Requests of other shapes than chat completions, Responses, Anthropic messages
/// and Gemini's `streamGenerateContent` pass.
pub fn check_request(path: &str, body: &Value) -> Result<(), String> {
    if path.ends_with(":streamGenerateContent")
        && let Some(contents) = body["contents"].as_array()
    {
        return check_gemini(contents);
    }
    if path.ends_with("/responses")
        && let Some(input) = body["input"].as_array()
    {
        return check_responses(input);
    }
    let Some(messages) = body["messages"].as_array() else {
        return Ok(());
    };
    if path.ends_with("/chat/completions") {
        check_chat(messages)
    } else if path.ends_with("/messages") {
        check_anthropic(messages)
    } else {
        Ok(())
    }
}

/// Chat completions: a `tool` message answers a call of the assistant message
/// before it; the calls are all answered before any other message.
fn check_chat(messages: &[Value]) -> Result<(), String> {
    let mut open: BTreeSet<String> = BTreeSet::new();
    for (index, message) in messages.iter().enumerate() {
        let role = message["role"].as_str().unwrap_or_default();
        if role == "tool" {
            let id = message["tool_call_id"].as_str().unwrap_or_default();
            if !open.remove(id) {
                return Err(format!(
                    "messages[{index}]: a tool result for `{id}`, which no open call of the assistant message before it has"
                ));
            }
            continue;
        }
        if !open.is_empty() {
            return Err(format!(
                "messages[{index}]: a {role} message while calls are unanswered: {}",
                open.into_iter().collect::<Vec<_>>().join(", ")
            ));
        }
        if role == "assistant" {
            open = call_ids(&message["tool_calls"]);
        }
    }
    Ok(())
}

/// Anthropic messages: user first, roles alternating; each `tool_use` answered by
/// a `tool_result` in the next (user) message, which answers nothing else.
fn check_anthropic(messages: &[Value]) -> Result<(), String> {
    let mut open: BTreeSet<String> = BTreeSet::new();
    let mut last_role = "assistant";
    for (index, message) in messages.iter().enumerate() {
        let role = message["role"].as_str().unwrap_or_default();
        if role == last_role {
            return Err(format!(
                "messages[{index}]: two {role} messages in a row (the roles alternate, the user first)"
            ));
        }
        let blocks = message["content"].as_array().cloned().unwrap_or_default();
        let answered: BTreeSet<String> = blocks
            .iter()
            .filter(|block| block["type"] == "tool_result")
            .filter_map(|block| block["tool_use_id"].as_str().map(str::to_owned))
            .collect();
        if answered != open {
            return Err(format!(
                "messages[{index}]: answers the calls {answered:?}; the assistant message before it left {open:?} open"
            ));
        }
        open = if role == "assistant" {
            tool_use_ids(&blocks)
        } else {
            BTreeSet::new()
        };
        last_role = role;
    }
    Ok(())
}

/// Responses input: a `function_call_output` answers an earlier `function_call`
/// not yet answered; every call is answered before the next message.
fn check_responses(input: &[Value]) -> Result<(), String> {
    let mut open: BTreeSet<String> = BTreeSet::new();
    for (index, item) in input.iter().enumerate() {
        let call_id = item["call_id"].as_str().unwrap_or_default().to_owned();
        match item["type"].as_str().unwrap_or("message") {
            "function_call" => {
                open.insert(call_id);
            }
            "function_call_output" if !open.remove(&call_id) => {
                return Err(format!(
                    "input[{index}]: an output for `{call_id}`, which no open call has"
                ));
            }
            "message" if !open.is_empty() => {
                return Err(format!(
                    "input[{index}]: a message while calls are unanswered: {}",
                    open.iter().cloned().collect::<Vec<_>>().join(", ")
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Gemini contents: user first, roles (`user`, `model`) alternating; the function
/// calls of a model turn answered, one response each, in the next (user) turn.
fn check_gemini(contents: &[Value]) -> Result<(), String> {
    let mut open: Vec<String> = Vec::new();
    let mut last_role = "model";
    for (index, turn) in contents.iter().enumerate() {
        let role = turn["role"].as_str().unwrap_or_default();
        if role == last_role {
            return Err(format!(
                "contents[{index}]: two {role} turns in a row (the roles alternate, the user first)"
            ));
        }
        let parts = turn["parts"].as_array().cloned().unwrap_or_default();
        let named = |kind: &str| -> Vec<String> {
            let mut names: Vec<String> = parts
                .iter()
                .filter_map(|part| part[kind]["name"].as_str().map(str::to_owned))
                .collect();
            names.sort();
            names
        };
        let answered = named("functionResponse");
        if answered != open {
            return Err(format!(
                "contents[{index}]: answers the calls {answered:?}; the model turn before it left {open:?} open"
            ));
        }
        open = if role == "model" {
            named("functionCall")
        } else {
            Vec::new()
        };
        last_role = role;
    }
    Ok(())
}

/// The ids of the entries of a `tool_calls` array.
fn call_ids(calls: &Value) -> BTreeSet<String> {
    calls
        .as_array()
        .map(|calls| {
            calls
                .iter()
                .filter_map(|call| call["id"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The ids of the `tool_use` blocks among `blocks`.
fn tool_use_ids(blocks: &[Value]) -> BTreeSet<String> {
    blocks
        .iter()
        .filter(|block| block["type"] == "tool_use")
        .filter_map(|block| block["id"].as_str().map(str::to_owned))
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn chat_results_follow_their_calls() {
        let call = json!({"role": "assistant", "tool_calls": [{"id": "c1"}, {"id": "c2"}]});
        let result = |id: &str| json!({"role": "tool", "tool_call_id": id});
        let user = json!({"role": "user", "content": "hi"});
        let good = json!({"messages": [user, call, result("c2"), result("c1"), user]});
        assert_eq!(check_request("/v1/chat/completions", &good), Ok(()));
        let unanswered = json!({"messages": [user, call, result("c1"), user]});
        assert!(check_request("/v1/chat/completions", &unanswered).is_err());
        let stray = json!({"messages": [user, result("c1")]});
        assert!(check_request("/v1/chat/completions", &stray).is_err());
    }

    #[test]
    fn anthropic_roles_alternate_and_results_answer_the_calls_before_them() {
        let user = json!({"role": "user", "content": [{"type": "text", "text": "hi"}]});
        let call = json!({"role": "assistant", "content": [{"type": "tool_use", "id": "t1"}]});
        let result =
            json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]});
        let answer = json!({"role": "assistant", "content": [{"type": "text", "text": "ok"}]});
        let good = json!({"messages": [user, call, result, answer]});
        assert_eq!(check_request("/v1/messages", &good), Ok(()));
        let twice = json!({"messages": [user, user]});
        assert!(check_request("/v1/messages", &twice).is_err());
        let unanswered = json!({"messages": [user, call, user]});
        assert!(check_request("/v1/messages", &unanswered).is_err());
    }

    #[test]
    fn responses_calls_are_answered_before_the_next_message() {
        let path = "/v1/responses";
        let user = json!({"type": "message", "role": "user", "content": "hi"});
        let call = |id: &str| json!({"type": "function_call", "call_id": id, "name": "t", "arguments": "{}"});
        let output =
            |id: &str| json!({"type": "function_call_output", "call_id": id, "output": "x"});
        let good = json!({"input": [user, call("a"), call("b"), output("b"), output("a"), user]});
        assert_eq!(check_request(path, &good), Ok(()));
        let unanswered = json!({"input": [user, call("a"), user]});
        assert!(check_request(path, &unanswered).is_err());
        let stray = json!({"input": [user, output("a")]});
        assert!(check_request(path, &stray).is_err());
    }

    #[test]
    fn gemini_turns_alternate_and_answer_every_call() {
        let path = "/v1beta/models/m:streamGenerateContent";
        let user = json!({"role": "user", "parts": [{"text": "hi"}]});
        let calls = json!({"role": "model", "parts": [
            {"functionCall": {"name": "a", "args": {}}},
            {"functionCall": {"name": "b", "args": {}}},
        ]});
        let response = |names: &[&str]| {
            json!({"role": "user", "parts": names.iter()
            .map(|name| json!({"functionResponse": {"name": name, "response": {}}}))
            .collect::<Vec<_>>()})
        };
        let answer = json!({"role": "model", "parts": [{"text": "done"}]});
        let good = json!({"contents": [user, calls, response(&["b", "a"]), answer]});
        assert_eq!(check_request(path, &good), Ok(()));
        let short = json!({"contents": [user, calls, response(&["a"]), answer]});
        assert!(check_request(path, &short).is_err());
        let twice = json!({"contents": [user, user]});
        assert!(check_request(path, &twice).is_err());
        let model_first = json!({"contents": [answer]});
        assert!(check_request(path, &model_first).is_err());
    }
}
