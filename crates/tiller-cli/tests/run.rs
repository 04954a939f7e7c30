//! `tiller run` end to end: the built binary against loopback servers speaking the
//! OpenAI and Anthropic dialects, with command tools that really run.

#![allow(clippy::unwrap_used)]

mod common;

use common::{
    Dialect, Scratch, agent_yaml, envelopes, event_kind, event_type, exit_of, finish, gone, lines,
    python_tool, read_until, readme_block, tiller,
};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tiller_test_support::{Cassette, MockResponse, MockServer, sse};

#[tokio::test]
async fn a_text_reply_streams_to_stdout() {
    for dialect in Dialect::BOTH {
        let server = MockServer::start().await;
        server.push(dialect.text(&["Hel", "lo", " there!"]));
        let run = finish(dialect.tiller(&server, "run", &["Say hello"])).await;
        assert_eq!(
            (run.code(), run.stdout.as_str(), run.stderr.as_str()),
            (Some(0), "Hello there!\n", ""),
            "{dialect:?}"
        );
        let request = &server.requests()[0];
        assert_eq!(dialect.last_user_text(request), "Say hello");
        match dialect {
            Dialect::OpenAi => {
                assert_eq!(request.path, "/v1/chat/completions");
                assert_eq!(request.body["model"], "local-model");
            }
            Dialect::Anthropic => {
                assert_eq!(request.path, "/v1/messages");
                assert_eq!(request.body["model"], "claude-test");
                assert_eq!(request.header("x-api-key"), Some("test-key"));
            }
        }
    }
}

#[tokio::test]
async fn a_command_tool_runs_for_two_rounds_and_its_output_reaches_the_model() {
    for dialect in Dialect::BOTH {
        let scratch = Scratch::new();
        scratch.write(
            "tools/add.py",
            &python_tool(
                "open(os.path.join(here, 'calls.log'), 'a').write(json.dumps(args) + '\\n')\n\
                 print(args['a'] + args['b'])",
            ),
        );
        let agent = scratch.write(
            "agent.yaml",
            &agent_yaml(
                "    - name: add\n      label: Adding\n      description: Add two integers\n      parameters: {type: object, properties: {a: {type: integer}, b: {type: integer}}, required: [a, b]}\n      command: [python3, tools/add.py]\n      timeout_ms: 10000\n",
            ),
        );
        let server = MockServer::start().await;
        server.push(dialect.tool_call("call_1", "add", json!({"a": 2, "b": 3})));
        server.push(dialect.tool_call("call_2", "add", json!({"a": 5, "b": 8})));
        server.push(dialect.text(&["The sums are 5 and 13."]));

        let run = finish(dialect.tiller(
            &server,
            "run",
            &["--agent", agent.to_str().unwrap(), "Add 2+3, then 5+8"],
        ))
        .await;
        assert_eq!(
            (run.code(), run.stdout.as_str(), run.stderr.as_str()),
            (
                Some(0),
                "The sums are 5 and 13.\n",
                "[Adding {\"a\":2,\"b\":3}] -> 5\n[Adding {\"a\":5,\"b\":8}] -> 13\n"
            ),
            "{dialect:?}"
        );
        let calls = std::fs::read_to_string(scratch.path().join("tools/calls.log")).unwrap();
        assert_eq!(calls, "{\"a\": 2, \"b\": 3}\n{\"a\": 5, \"b\": 8}\n");

        let requests = server.requests();
        assert_eq!(requests.len(), 3);
        let results: Vec<Value> = requests
            .iter()
            .map(|r| json!(dialect.tool_results(r)))
            .collect();
        let result = |id: &str, text: &str| match dialect {
            Dialect::OpenAi => json!({"id": id, "text": text}),
            Dialect::Anthropic => json!({"id": id, "text": text, "is_error": false}),
        };
        assert_eq!(
            results,
            [
                json!([]),
                json!([result("call_1", "5")]),
                json!([result("call_1", "5"), result("call_2", "13")])
            ]
        );
        let system = match dialect {
            Dialect::OpenAi => requests[0].body["messages"][0]["content"].clone(),
            Dialect::Anthropic => requests[0].body["system"][0]["text"].clone(),
        };
        assert_eq!(system, "You are a careful assistant.", "{dialect:?}");
    }
}

#[tokio::test]
async fn a_failing_tool_becomes_an_error_result_and_the_run_goes_on() {
    let scratch = Scratch::new();
    scratch.write(
        "tools/fail.py",
        &python_tool("print('half done')\nprint('boom: bad input', file=sys.stderr)\nsys.exit(3)"),
    );
    let agent = scratch.write(
        "agent.yaml",
        &agent_yaml("    - name: fail\n      description: Always fails\n      command: [python3, tools/fail.py]\n"),
    );
    let dialect = Dialect::Anthropic;
    let server = MockServer::start().await;
    server.push(dialect.tool_call("toolu_1", "fail", json!({})));
    server.push(dialect.text(&["It failed."]));
    let run = finish(dialect.tiller(
        &server,
        "run",
        &["--agent", agent.to_str().unwrap(), "Try it"],
    ))
    .await;
    assert_eq!(
        (run.code(), run.stdout.as_str(), run.stderr.as_str()),
        (
            Some(0),
            "It failed.\n",
            "[fail {}] failed: `fail` exited with status 3; the end of its stderr: …\n"
        )
    );
    assert_eq!(
        dialect.tool_results(&server.requests()[1]),
        [json!({
            "id": "toolu_1",
            "text": "`fail` exited with status 3; the end of its stderr:\nboom: bad input",
            "is_error": true
        })]
    );
}

#[tokio::test]
async fn a_tool_past_its_timeout_is_killed_and_reported() {
    let scratch = Scratch::new();
    // The tool's pid on this machine (in a PID namespace of its own it is 2).
    scratch.write(
        "tools/slow.py",
        &python_tool(
            "open(os.path.join(here, 'pid'), 'w').write(os.readlink('/proc/self'))\n\
             print('started', file=sys.stderr, flush=True)\n\
             time.sleep(60)",
        ),
    );
    let agent = scratch.write(
        "agent.yaml",
        &agent_yaml("    - name: slow\n      description: Never ends\n      command: [python3, tools/slow.py]\n      timeout_ms: 1500\n"),
    );
    let dialect = Dialect::OpenAi;
    let server = MockServer::start().await;
    server.push(dialect.tool_call("call_1", "slow", json!({})));
    server.push(dialect.text(&["Too slow."]));
    let run =
        finish(dialect.tiller(&server, "run", &["--agent", agent.to_str().unwrap(), "Go"])).await;
    assert_eq!((run.code(), run.stdout.as_str()), (Some(0), "Too slow.\n"));
    assert_eq!(
        dialect.tool_results(&server.requests()[1]),
        [
            json!({"id": "call_1", "text": "`slow` timed out after 1500 ms; the end of its stderr:\nstarted"})
        ]
    );
    let pid: i32 = std::fs::read_to_string(scratch.path().join("tools/pid"))
        .unwrap()
        .parse()
        .unwrap();
    gone(pid).await;
}

#[tokio::test]
async fn options_override_the_agent_file_and_a_turn_limit_fails_the_run() {
    let scratch = Scratch::new();
    scratch.write("tools/echo.py", &python_tool("print(args)"));
    let agent = scratch.write(
        "agent.yaml",
        &agent_yaml(
            "    - name: echo\n      description: Echo\n      command: [python3, tools/echo.py]\n",
        ),
    );
    let dialect = Dialect::OpenAi;
    let server = MockServer::start().await;
    server.push(dialect.tool_call("call_1", "echo", json!({})));
    let run = finish(dialect.tiller(
        &server,
        "run",
        &[
            "--agent",
            agent.to_str().unwrap(),
            "--system",
            "Be terse.",
            "--max-turns",
            "1",
            "--max-tokens",
            "64",
            "Go",
        ],
    ))
    .await;
    assert_eq!(
        (run.code(), run.stdout.as_str(), run.stderr.as_str()),
        (
            Some(1),
            "",
            "[echo {}] -> {}\ntiller: the run reached its turn limit with work left\n"
        )
    );
    let requests = server.requests();
    assert_eq!(requests.len(), 1, "one turn only");
    assert_eq!(
        requests[0].body["messages"][0],
        json!({"role": "system", "content": "Be terse."})
    );
    assert_eq!(requests[0].body["max_tokens"], json!(64));
}

/// An agent file in `scratch` with one command tool, `echo`, printing its `text`.
fn echo_agent(scratch: &Scratch) -> std::path::PathBuf {
    scratch.write("tools/echo.py", &python_tool("print(args['text'])"));
    scratch.write(
        "agent.yaml",
        &agent_yaml("    - name: echo\n      description: Echo\n      parameters: {type: object, properties: {text: {type: string}}, required: [text]}\n      command: [python3, tools/echo.py]\n"),
    )
}

#[tokio::test]
async fn jsonl_writes_every_envelope_in_the_library_order() {
    let scratch = Scratch::new();
    let agent = echo_agent(&scratch);
    let dialect = Dialect::OpenAi;
    let server = MockServer::start().await;
    server.push(dialect.tool_call("call_1", "echo", json!({"text": "ping"})));
    server.push(dialect.text(&["Got ", "ping."]));
    let run = finish(dialect.tiller(
        &server,
        "run",
        &[
            "--agent",
            agent.to_str().unwrap(),
            "--events",
            "jsonl",
            "Echo ping",
        ],
    ))
    .await;
    assert_eq!((run.code(), run.stderr.as_str()), (Some(0), ""));

    let lines = envelopes(&run.stdout);
    let kinds: Vec<String> = lines.iter().map(event_kind).collect();
    assert_eq!(
        kinds,
        [
            "agent_start",
            "turn_start",
            "message_start:user",
            "message_end:user",
            "message_start:assistant",
            "message_update:tool_call_start",
            "message_update:tool_call_delta",
            "message_update:tool_call_delta",
            "message_update:tool_call_end",
            "message_end:assistant",
            "tool_execution_start",
            "tool_execution_end",
            "message_start:tool_result",
            "message_end:tool_result",
            "turn_end",
            "turn_start",
            "message_start:assistant",
            "message_update:text_start",
            "message_update:text_delta",
            "message_update:text_delta",
            "message_update:text_end",
            "message_end:assistant",
            "turn_end",
            "agent_end",
        ]
    );
    let end = &lines.last().unwrap()["event"];
    assert_eq!(end["reason"], "completed");
    assert_eq!(end["messages"].as_array().unwrap().len(), 4);
    assert_eq!(
        lines[11]["event"],
        json!({
            "type": "tool_execution_end",
            "tool_call_id": "call_1",
            "tool_name": "echo",
            "result": {"content": [{"type": "text", "text": "ping"}], "details": {"exit_code": 0}},
            "is_error": false
        })
    );
}

#[tokio::test]
async fn an_interrupt_aborts_a_slow_stream_and_exits_130() {
    let server = MockServer::start().await;
    let start = sse::openai_text_events(&["Once", " upon"]);
    server.push(MockResponse::sse("").chunks(start[..2].to_vec()).stall());
    let mut child = Dialect::OpenAi
        .tiller(&server, "run", &["--events", "jsonl", "Tell a long story"])
        .spawn()
        .unwrap();
    let mut stdout = lines(child.stdout.take().unwrap());
    let before = read_until(&mut stdout, |line| line.contains("\"text_delta\"")).await;
    interrupt(child.id().unwrap());
    let mut all = before;
    while let Some(line) = stdout.recv().await {
        all.push(line);
    }
    let status = exit_of(&mut child).await;
    assert_eq!(status.code(), Some(130));
    let last: Value = serde_json::from_str(all.last().unwrap()).unwrap();
    assert_eq!(event_type(&last), "agent_end");
    assert_eq!(last["event"]["reason"], "aborted");
    let answer = &last["event"]["messages"][1];
    assert_eq!(
        (&answer["stop_reason"], &answer["content"][0]["text"]),
        (&json!("aborted"), &json!("Once"))
    );
}

#[tokio::test]
async fn without_a_provider_the_faux_model_answers_and_says_so() {
    let run = finish(tiller(&["run", "Hello"])).await;
    assert_eq!(run.code(), Some(0));
    assert!(
        run.stdout
            .starts_with("You said: \"Hello\". I am Tiller's scripted faux model"),
        "{}",
        run.stdout
    );
    assert_eq!(
        run.stderr,
        "tiller: no provider configured (use --provider, --base-url or --model, or set a provider's key such as OPENAI_API_KEY, ANTHROPIC_API_KEY or GEMINI_API_KEY): using the scripted faux model\n"
    );
}

/// The README's PDF, from the repository's root.
const REPORT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../examples/files/report.pdf"
);

#[tokio::test]
async fn a_file_goes_with_the_prompt_in_each_dialects_form() {
    let data = tiller::ai::FileContent::read(REPORT).unwrap().data;
    for dialect in Dialect::BOTH {
        let server = MockServer::start().await;
        server.push(dialect.text(&["A report."]));
        let run = finish(dialect.tiller(
            &server,
            "run",
            &["--file", REPORT, "What does the report say?"],
        ))
        .await;
        assert_eq!((run.code(), run.stdout.as_str()), (Some(0), "A report.\n"));
        let request = &server.requests()[0];
        let content = &request.body["messages"][0]["content"];
        let expected = match dialect {
            Dialect::OpenAi => json!({"type": "file", "file": {
                "filename": "report.pdf",
                "file_data": format!("data:application/pdf;base64,{data}"),
            }}),
            Dialect::Anthropic => json!({
                "type": "document",
                "source": {"type": "base64", "media_type": "application/pdf", "data": data},
                "title": "report.pdf",
                "cache_control": {"type": "ephemeral"},
            }),
        };
        assert_eq!(
            (&content[0]["text"], &content[1]),
            (&json!("What does the report say?"), &expected),
            "{dialect:?}"
        );
    }
}

#[tokio::test]
async fn the_readmes_pdf_question_is_answered_as_shown() {
    let command = readme_block("### Files and documents", "sh");
    let args: Vec<&str> = command
        .trim()
        .strip_prefix("cargo run --bin tiller -- ")
        .unwrap()
        .split(' ')
        .collect();
    assert_eq!(&args[..3], ["run", "--file", "examples/files/report.pdf"]);
    let prompt = args[3..].join(" ");
    let run = finish(tiller(&[
        args[0],
        args[1],
        REPORT,
        prompt.trim_matches('"'),
    ]))
    .await;
    assert_eq!(run.code(), Some(0), "{}", run.stderr);
    assert_eq!(run.stdout, readme_block("### Files and documents", "text"));
}

#[tokio::test]
async fn a_file_that_cannot_be_sent_is_refused_before_any_run() {
    let run = finish(tiller(&["run", "--file", "/no/such.pdf", "Hello"])).await;
    assert_eq!(run.code(), Some(2));
    assert!(
        run.stderr.ends_with(
            "tiller: could not read /no/such.pdf: No such file or directory (os error 2)\n"
        ),
        "{}",
        run.stderr
    );
    let run = finish(tiller(&[
        "run",
        "--file",
        env!("CARGO_MANIFEST_DIR"),
        "Hello",
    ]))
    .await;
    assert_eq!(run.code(), Some(2), "{}", run.stderr);
}

#[tokio::test]
async fn a_provider_error_exits_1_with_its_message() {
    let server = MockServer::start().await;
    server.push(MockResponse::json(
        401,
        &json!({"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}}),
    ));
    let run = finish(Dialect::OpenAi.tiller(&server, "run", &["Hello"])).await;
    assert_eq!((run.code(), run.stdout.as_str()), (Some(1), ""));
    assert!(
        run.stderr.starts_with("tiller: ")
            && run.stderr.contains("401")
            && run.stderr.contains("Incorrect API key provided"),
        "{}",
        run.stderr
    );
}

/// `tiller run --provider PROVIDER --base-url BASE_URL --model MODEL PROMPT`.
fn run_with_provider(
    provider: &str,
    base_url: &str,
    model: &str,
    prompt: &str,
) -> tokio::process::Command {
    tiller(&[
        "run",
        "--provider",
        provider,
        "--base-url",
        base_url,
        "--model",
        model,
        prompt,
    ])
}

/// `tiller run --provider gemini` against a replay of a recorded Gemini exchange,
/// the key from `GEMINI_API_KEY` going to the base URL the user named.
#[tokio::test]
async fn gemini_answers_from_a_replayed_recording() {
    let cassette = Cassette::load(
        "gemini",
        "streaming__final_metadata_exposes_finish_reason_and_model_version",
    );
    let server = MockServer::start().await;
    server.push_cassette(&cassette);
    let base_url = format!("{}/v1beta", server.origin());
    let mut command = run_with_provider(
        "gemini",
        &base_url,
        "gemini-2.5-flash",
        "Say: final metadata ok",
    );
    command.env("GEMINI_API_KEY", "test-key");
    let run = finish(command).await;
    assert_eq!(
        (run.code(), run.stdout.as_str(), run.stderr.as_str()),
        (Some(0), "final metadata ok\n", "")
    );
    let request = &server.requests()[0];
    assert_eq!(request.path, cassette.exchanges[0].request.path);
    assert_eq!(request.header("x-goog-api-key"), Some("test-key"));
    assert_eq!(
        request.body["contents"],
        json!([{"role": "user", "parts": [{"text": "Say: final metadata ok"}]}])
    );
}

/// `tiller run --provider openai-responses` against a replay of a recorded
/// exchange of OpenAI's Responses API.
#[tokio::test]
async fn openai_responses_answers_from_a_replayed_recording() {
    let cassette = Cassette::load(
        "openai-responses",
        "raw_stream_capture_matrix__responses_stream_raw_round_trips_typed",
    );
    let server = MockServer::start().await;
    server.push_cassette(&cassette);
    let base_url = server.base_url();
    let mut command = run_with_provider("openai-responses", &base_url, "gpt-4.1-mini", "Say hello");
    command.env("OPENAI_API_KEY", "test-key");
    let run = finish(command).await;
    let recorded: String = cassette.exchanges[0]
        .response
        .body
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .map(|data| serde_json::from_str::<Value>(data).unwrap())
        .filter(|event| event["type"] == "response.output_text.delta")
        .map(|event| event["delta"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        (run.code(), run.stdout.as_str(), run.stderr.as_str()),
        (Some(0), format!("{recorded}\n").as_str(), "")
    );
    let request = &server.requests()[0];
    assert_eq!(request.path, "/v1/responses");
    assert_eq!(request.header("authorization"), Some("Bearer test-key"));
    assert_eq!(request.body["model"], "gpt-4.1-mini");
}

/// `tiller run --provider bedrock` against a replay of a recorded Bedrock
/// exchange: the request is signed with SigV4 from the environment's credentials,
/// or from a profile of the shared credentials file.
#[tokio::test]
async fn bedrock_signs_its_requests_and_answers_from_a_replayed_recording() {
    let cassette = Cassette::load("bedrock", "raw_streaming__raw_stream_text_response_smoke");
    let scratch = Scratch::new();
    let credentials = scratch.write(
        "credentials",
        "[default]\naws_access_key_id = DEFAULTKEY\naws_secret_access_key = d\n[work]\naws_access_key_id = WORKKEY\naws_secret_access_key = w\n",
    );
    let environment = [
        ("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE"),
        (
            "AWS_SECRET_ACCESS_KEY",
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        ),
        ("AWS_SESSION_TOKEN", "session-token"),
        ("AWS_REGION", "eu-west-1"),
    ];
    let profile = [
        ("AWS_SHARED_CREDENTIALS_FILE", credentials.to_str().unwrap()),
        ("AWS_PROFILE", "work"),
    ];
    for (variables, key_id, region) in [
        (&environment[..], "AKIDEXAMPLE", "eu-west-1"),
        (&profile[..], "WORKKEY", "us-east-1"),
    ] {
        let server = MockServer::start().await;
        // A 503 first: the retry is signed anew.
        server.push(MockResponse::status(503, "busy"));
        server.push_cassette(&cassette);
        let base_url = server.origin();
        let mut command = run_with_provider(
            "bedrock",
            &base_url,
            "amazon.nova-lite-v1:0",
            "Reply with two lines",
        );
        command.envs(variables.iter().copied());
        let run = finish(command).await;
        assert_eq!(
            (run.code(), run.stdout.as_str(), run.stderr.as_str()),
            (Some(0), "cedar\nmaple\n", "")
        );
        let requests = server.requests();
        assert_eq!(requests.len(), 2);
        for request in &requests {
            let signatures = request
                .headers
                .iter()
                .filter(|(name, _)| name == "authorization")
                .count();
            assert_eq!(signatures, 1, "one signature per attempt");
        }
        let request = &requests[1];
        assert_eq!(request.path, cassette.exchanges[0].request.path);
        let authorization = request.header("authorization").unwrap();
        let date = request.header("x-amz-date").unwrap();
        let scope = format!("{key_id}/{}/{region}/bedrock/aws4_request", &date[..8]);
        assert!(
            authorization.starts_with(&format!(
                "AWS4-HMAC-SHA256 Credential={scope}, SignedHeaders="
            )),
            "{authorization}"
        );
        let signature = authorization.rsplit("Signature=").next().unwrap();
        assert!(
            signature.len() == 64 && signature.bytes().all(|b| b.is_ascii_hexdigit()),
            "{authorization}"
        );
        for signed in ["content-type", "host", "x-amz-date"] {
            assert!(
                authorization.contains(signed),
                "{signed} unsigned: {authorization}"
            );
        }
        let token = (key_id == "AKIDEXAMPLE").then_some("session-token");
        assert_eq!(request.header("x-amz-security-token"), token);
    }

    // No credentials: a typed error naming where they go, and no request.
    let server = MockServer::start().await;
    let base_url = server.origin();
    let mut command = run_with_provider("bedrock", &base_url, "amazon.nova-lite-v1:0", "Hi");
    command.env("HOME", scratch.path());
    let run = finish(command).await;
    assert_eq!(run.code(), Some(1), "{}", run.stderr);
    assert!(
        run.stderr
            .contains("AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"),
        "{}",
        run.stderr
    );
    assert!(server.requests().is_empty());
}

#[tokio::test]
async fn bad_usage_exits_2() {
    let run = finish(tiller(&["run", "--thinking", "extreme", "Hello"])).await;
    assert_eq!(run.code(), Some(2));
    assert!(
        run.stderr
            .contains("invalid value 'extreme' for '--thinking <LEVEL>'"),
        "{}",
        run.stderr
    );
    let run = finish(tiller(&["run", "--model", "gpt-4o", "Hello"])).await;
    assert_eq!(
        (run.code(), run.stderr.as_str()),
        (
            Some(2),
            "tiller: --model gpt-4o: name the provider too (`provider/model-id`), or give a provider or a base URL\n"
        )
    );
    let run = finish(tiller(&["run", "  "])).await;
    assert_eq!(
        (run.code(), run.stderr.as_str()),
        (Some(2), "tiller: the prompt is empty\n")
    );
}

#[tokio::test]
async fn version_and_help() {
    let run = finish(tiller(&["--version"])).await;
    assert_eq!(
        (run.code(), run.stdout.as_str()),
        (Some(0), concat!("tiller ", env!("CARGO_PKG_VERSION"), "\n"))
    );
    let run = finish(tiller(&["run", "--help"])).await;
    assert_eq!(run.code(), Some(0));
    for option in [
        "--agent",
        "--provider",
        "--base-url",
        "--model",
        "--system",
        "--thinking",
        "--max-turns",
        "--max-tokens",
        "--events",
    ] {
        assert!(run.stdout.contains(option), "run --help lacks {option}");
    }
}

#[allow(unsafe_code)]
fn interrupt(pid: u32) {
    // SAFETY: kill only sends a signal to the child we started.
    unsafe {
        libc::kill(pid as libc::pid_t, libc::SIGINT);
    }
}

/// An agent file whose answer must match its schema.
fn structured_agent(scratch: &Scratch) -> std::path::PathBuf {
    scratch.write(
        "city.yaml",
        "type: object\n\
         description: You name cities.\n\
         properties:\n  name: {type: string}\n  population: {type: integer}\n\
         required: [name, population]\n\
         json_schema_extra:\n  kind: agent\n  name: city finder\n  structured_output: true\n",
    )
}

#[tokio::test]
async fn structured_output_prints_the_validated_json_after_a_correction() {
    for dialect in Dialect::BOTH {
        let scratch = Scratch::new();
        let agent = structured_agent(&scratch);
        let server = MockServer::start().await;
        match dialect {
            // OpenAI's answer is text that follows the schema.
            Dialect::OpenAi => {
                server.push(dialect.text(&["{\"name\": ", "\"Oslo\"}"]));
                server.push(dialect.text(&["{\"name\": \"Oslo\", ", "\"population\": 709000}"]));
            }
            // Anthropic's is a call of the output tool, read back as text.
            Dialect::Anthropic => {
                server.push(dialect.tool_call("toolu_1", "city_finder", json!({"name": "Oslo"})));
                server.push(dialect.tool_call(
                    "toolu_2",
                    "city_finder",
                    json!({"name": "Oslo", "population": 709000}),
                ));
            }
        }
        let run = finish(dialect.tiller(
            &server,
            "run",
            &[
                "--agent",
                agent.to_str().unwrap(),
                "Largest city of Norway?",
            ],
        ))
        .await;
        assert_eq!(
            (run.code(), run.stdout.as_str(), run.stderr.as_str()),
            (
                Some(0),
                "{\n  \"name\": \"Oslo\",\n  \"population\": 709000\n}\n",
                ""
            ),
            "{dialect:?}"
        );
        let requests = server.requests();
        assert_eq!(requests.len(), 2, "{dialect:?}");
        let schema = json!({
            "type": "object",
            "properties": {"name": {"type": "string"}, "population": {"type": "integer"}},
            "required": ["name", "population"],
        });
        match dialect {
            // OpenAI-compatible servers get the schema as `response_format`.
            Dialect::OpenAi => assert_eq!(
                requests[0].body["response_format"],
                json!({
                    "type": "json_schema",
                    "json_schema": {"name": "city_finder", "schema": schema, "strict": false},
                })
            ),
            // Anthropic gets it as a tool whose call is forced.
            Dialect::Anthropic => {
                assert_eq!(requests[0].body["system"][0]["text"], "You name cities.");
                assert_eq!(
                    requests[0].body["tools"],
                    json!([{
                        "name": "city_finder",
                        "description": "Give your final answer by calling this tool: its input is the answer.",
                        "input_schema": schema,
                    }])
                );
                assert_eq!(
                    requests[0].body["tool_choice"],
                    json!({"type": "tool", "name": "city_finder"})
                );
                assert!(requests[0].body.get("response_format").is_none());
            }
        }
        assert_eq!(
            dialect.last_user_text(&requests[1]),
            "Your answer does not match the required JSON Schema:\n  - root: \"population\" is a required property\n\nAnswer again with only a JSON value that matches the schema.",
            "{dialect:?}"
        );
    }
}

#[tokio::test]
async fn structured_output_that_never_matches_fails_with_the_errors() {
    let dialect = Dialect::OpenAi;
    let scratch = Scratch::new();
    let agent = structured_agent(&scratch);
    let server = MockServer::start().await;
    for _ in 0..3 {
        server.push(dialect.text(&["Oslo."]));
    }
    let run = finish(dialect.tiller(
        &server,
        "run",
        &[
            "--agent",
            agent.to_str().unwrap(),
            "Largest city of Norway?",
        ],
    ))
    .await;
    assert_eq!(
        (run.code(), run.stdout.as_str(), run.stderr.as_str()),
        (
            Some(1),
            "",
            "tiller: the answer did not match the output schema after 3 attempts: root: the answer is not JSON: expected value at line 1 column 1\n"
        )
    );
}

#[tokio::test]
async fn the_action_tool_emits_a_typed_event_beside_the_text() {
    let scratch = Scratch::new();
    let agent = scratch.write(
        "guide.yaml",
        "type: object\n\
         description: You guide users around the site.\n\
         json_schema_extra:\n  kind: agent\n  name: guide\n  tools:\n    - name: action\n      types:\n        open_page: {type: object, properties: {url: {type: string}}, required: [url]}\n",
    );
    let dialect = Dialect::OpenAi;
    let server = MockServer::start().await;
    server.push(dialect.tool_call(
        "call_1",
        "action",
        json!({"type": "open_page", "payload": {"url": "/pricing"}}),
    ));
    server.push(dialect.text(&["I opened the pricing page."]));
    let run = finish(dialect.tiller(
        &server,
        "run",
        &[
            "--agent",
            agent.to_str().unwrap(),
            "--events",
            "jsonl",
            "Show me the prices",
        ],
    ))
    .await;
    assert_eq!((run.code(), run.stderr.as_str()), (Some(0), ""));
    let lines = envelopes(&run.stdout);
    let kinds: Vec<String> = lines.iter().map(event_kind).collect();
    let start = kinds
        .iter()
        .position(|kind| kind == "tool_execution_start")
        .unwrap();
    assert_eq!(
        kinds[start..start + 3],
        ["tool_execution_start", "action", "tool_execution_end"]
    );
    assert_eq!(
        lines[start + 1]["event"],
        json!({
            "type": "action",
            "tool_call_id": "call_1",
            "action_type": "open_page",
            "payload": {"url": "/pricing"},
        })
    );
    // The offered tool lists the declared types; the call and its result stay in
    // the conversation.
    let requests = server.requests();
    let offered = &requests[0].body["tools"][0]["function"];
    assert_eq!(offered["name"], "action");
    assert_eq!(
        offered["parameters"]["properties"]["type"]["enum"],
        json!(["open_page"])
    );
    assert_eq!(
        dialect.tool_results(&requests[1]),
        [json!({"id": "call_1", "text": "Action `open_page` sent."})]
    );

    // In text mode the action is a line on stderr.
    server.push(dialect.tool_call(
        "call_2",
        "action",
        json!({"type": "open_page", "payload": {"url": "/docs"}}),
    ));
    server.push(dialect.text(&["Opened."]));
    let run = finish(dialect.tiller(
        &server,
        "run",
        &["--agent", agent.to_str().unwrap(), "Docs?"],
    ))
    .await;
    assert_eq!(
        (run.code(), run.stdout.as_str(), run.stderr.as_str()),
        (
            Some(0),
            "Opened.\n",
            "[action open_page {\"url\":\"/docs\"}]\n[action {\"payload\":{\"url\":\"/docs\"},\"type\":\"open_page\"}] -> Action `open_page` sent.\n"
        )
    );
}

#[tokio::test]
async fn an_agent_file_names_an_llm_configuration_from_llms() {
    let scratch = Scratch::new();
    let server = MockServer::start().await;
    let llms = scratch.write(
        "llms.yaml",
        &format!(
            "local:\n  base_url: \"{}\"\n  model: local-llm\n  temperature: 0.5\n  max_tokens: 77\n",
            server.base_url()
        ),
    );
    let agent = scratch.write(
        "agent.yaml",
        "type: object\ndescription: You are brief.\njson_schema_extra: {kind: agent, name: brief, llm: local, temperature: 0.25}\n",
    );
    server.push(Dialect::OpenAi.text(&["Hi."]));
    let run = finish(tiller(&[
        "run",
        "--agent",
        agent.to_str().unwrap(),
        "--llms",
        llms.to_str().unwrap(),
        "Hello",
    ]))
    .await;
    assert_eq!(
        (run.code(), run.stdout.as_str(), run.stderr.as_str()),
        (Some(0), "Hi.\n", "")
    );
    let body = &server.requests()[0].body;
    assert_eq!(
        (&body["model"], &body["temperature"], &body["max_tokens"]),
        (&json!("local-llm"), &json!(0.25), &json!(77))
    );

    // Without the configurations, the name is an error that says so.
    let run = finish(tiller(&[
        "run",
        "--agent",
        agent.to_str().unwrap(),
        "Hello",
    ]))
    .await;
    assert_eq!(
        (run.code(), run.stderr.as_str()),
        (
            Some(2),
            format!(
                "tiller: {}: json_schema_extra.llm: no LLM configuration `local` (there are none)\n",
                agent.display()
            )
            .as_str()
        )
    );
}

/// The spans of an OTLP/HTTP JSON export, each as its name, its attributes (by
/// key, values as JSON) and whether its parent is the span named.
#[cfg(feature = "otlp")]
fn exported_spans(
    requests: &[tiller_test_support::CapturedRequest],
) -> Vec<(String, Value, String)> {
    let mut spans = Vec::new();
    for request in requests
        .iter()
        .filter(|request| request.path == "/v1/traces")
    {
        for resource in request.body["resourceSpans"]
            .as_array()
            .into_iter()
            .flatten()
        {
            for scope in resource["scopeSpans"].as_array().into_iter().flatten() {
                for span in scope["spans"].as_array().into_iter().flatten() {
                    let attributes: serde_json::Map<String, Value> = span["attributes"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|attribute| {
                            let value = attribute["value"]
                                .as_object()
                                .and_then(|v| v.values().next().cloned());
                            (
                                attribute["key"].as_str().unwrap().to_owned(),
                                value.unwrap_or(Value::Null),
                            )
                        })
                        .collect();
                    spans.push((
                        span["name"].as_str().unwrap().to_owned(),
                        Value::Object(attributes),
                        format!(
                            "{}/{}",
                            span["parentSpanId"].as_str().unwrap(),
                            span["spanId"].as_str().unwrap()
                        ),
                    ));
                }
            }
        }
    }
    spans
}

/// Without the `otlp` feature (the default build, as `.ci/run` tests it), an
/// endpoint set is said to go unused, and the run goes on.
#[cfg(not(feature = "otlp"))]
#[tokio::test]
async fn a_tiller_built_without_otlp_says_its_spans_are_not_exported() {
    let mut command = tiller(&["run", "Hello"]);
    command.env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318");
    let run = finish(command).await;
    assert_eq!(run.code(), Some(0), "{}", run.stderr);
    assert!(
        run.stderr.starts_with(
            "tiller: traces are not exported: this tiller was built without `--features otlp`\n"
        ),
        "{}",
        run.stderr
    );
}

#[cfg(feature = "otlp")]
#[tokio::test]
async fn with_an_otlp_endpoint_the_runs_spans_are_exported_with_genai_attributes() {
    let receiver = MockServer::start().await;
    receiver
        .lenient()
        .always(MockResponse::json(200, &json!({})));
    let server = MockServer::start().await;
    server.push(MockResponse::sse(sse::openai_text(&["Hel", "lo"])));
    let mut command = Dialect::OpenAi.tiller(&server, "run", &["Say hello"]);
    command
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.origin())
        .env("OTEL_SERVICE_NAME", "tiller-test");
    let run = finish(command).await;
    assert_eq!(
        (run.code(), run.stdout.as_str(), run.stderr.as_str()),
        (Some(0), "Hello\n", "")
    );
    let requests = receiver.requests();
    assert!(requests.iter().all(|r| r.path == "/v1/traces" && r.header("content-type") == Some("application/json")));
    let resource = &requests[0].body["resourceSpans"][0]["resource"]["attributes"];
    assert!(
        resource
            .as_array()
            .unwrap()
            .contains(&json!({"key": "service.name", "value": {"stringValue": "tiller-test"}})),
        "{resource}"
    );
    let spans = exported_spans(&requests);
    let named = |name: &str| {
        spans
            .iter()
            .find(|(n, _, _)| n == name)
            .unwrap_or_else(|| panic!("no span {name}: {spans:#?}"))
    };
    let (_, chat, chat_ids) = named("chat local-model");
    assert_eq!(chat["gen_ai.operation.name"], "chat");
    assert_eq!(chat["gen_ai.request.model"], "local-model");
    assert_eq!(chat["gen_ai.response.finish_reasons"], "[\"stop\"]");
    // Integers travel as strings in OTLP's JSON.
    assert_eq!(chat["gen_ai.usage.input_tokens"], "10");
    assert_eq!(chat["gen_ai.usage.output_tokens"], "2");
    // No message content.
    assert!(
        !requests
            .iter()
            .any(|r| r.body.to_string().contains("Say hello"))
    );
    // chat ⊂ turn ⊂ invoke_agent ⊂ run.
    let parent_of = |ids: &str| ids.split_once('/').unwrap().0.to_owned();
    let id_of = |ids: &str| ids.split_once('/').unwrap().1.to_owned();
    let (_, _, turn_ids) = named("turn");
    let (_, agent, agent_ids) = named("invoke_agent");
    let (_, _, run_ids) = named("run");
    assert_eq!(parent_of(chat_ids), id_of(turn_ids));
    assert_eq!(parent_of(turn_ids), id_of(agent_ids));
    assert_eq!(parent_of(agent_ids), id_of(run_ids));
    assert_eq!(agent["gen_ai.operation.name"], "invoke_agent");
}

#[tokio::test]
async fn a_budget_that_runs_out_is_said_on_stderr_and_exits_1() {
    let scratch = Scratch::new();
    let file = scratch.write(
        "agent.yaml",
        "type: object\ndescription: \"\"\njson_schema_extra:\n  kind: agent\n  name: helper\n  model: faux\n  budget: {run: {model_calls: 0}}\n",
    );
    let run = finish(tiller(&["run", "--agent", file.to_str().unwrap(), "Hello"])).await;
    assert_eq!(
        (run.code(), run.stdout.as_str(), run.stderr.as_str()),
        (
            Some(1),
            "",
            "[the run budget of model_calls ran out: 0 spent of 0]\ntiller: a budget ran out (its budget_exceeded event says which)\n"
        )
    );
}

/// A model streaming a 100,000-character answer in 4-character pieces:
/// `--events jsonl` writes it a few times over (each update carries its
/// piece), not once per piece, and its pieces give the answer back;
/// `--events jsonl-full` carries the answer so far in each update.
#[tokio::test]
async fn json_lines_cost_what_the_answer_carries_and_full_is_there_when_asked() {
    let answer: String = "echo \"this\" back\n"
        .chars()
        .cycle()
        .take(100_000)
        .collect();
    let pieces: Vec<String> = answer
        .as_bytes()
        .chunks(4)
        .map(|piece| String::from_utf8(piece.to_vec()).unwrap())
        .collect();
    let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
    let server = MockServer::start().await;
    server.push(MockResponse::sse(sse::openai_text(&pieces)));
    server.push(MockResponse::sse(sse::openai_text(&[
        "Whole", " every", " time.",
    ])));
    let run = finish(Dialect::OpenAi.tiller(&server, "run", &["--events", "jsonl", "Echo"])).await;
    assert_eq!(run.code(), Some(0), "{}", run.stderr);
    let lines = envelopes(&run.stdout);
    let updates: Vec<&Value> = lines
        .iter()
        .filter(|line| event_type(line) == "message_update")
        .collect();
    assert_eq!(
        updates.len(),
        25_000 + 2,
        "text_start, the pieces, text_end"
    );
    for update in &updates {
        let piece = &update["event"]["assistant_message_event"];
        let escaped = piece
            .get("delta")
            .map_or(0, |delta| delta.to_string().len());
        assert!(update.to_string().len() <= 200 + escaped, "{update}");
    }
    // The answer in its message_end, turn_end and agent_end, and in pieces.
    let bytes = run.stdout.len();
    assert!(
        bytes < 4 * answer.len() + 200 * lines.len(),
        "{bytes} bytes for {} lines",
        lines.len()
    );
    let text: String = updates
        .iter()
        .filter_map(|update| update["event"]["assistant_message_event"]["delta"].as_str())
        .collect();
    assert_eq!(text, answer);

    let full =
        finish(Dialect::OpenAi.tiller(&server, "run", &["--events", "jsonl-full", "Again"])).await;
    let texts: Vec<Value> = envelopes(&full.stdout)
        .into_iter()
        .filter(|line| event_type(line) == "message_update")
        .map(|line| line["event"]["message"]["content"][0]["text"].clone())
        .collect();
    assert_eq!(
        texts,
        [
            "",
            "Whole",
            "Whole every",
            "Whole every time.",
            "Whole every time."
        ]
        .map(|text| json!(text))
    );
}

/// The README's rebuild rule, in JavaScript (node) and Python as the README
/// writes it, rebuilds every assistant message of a run with reasoning, text
/// and a tool call from `--events jsonl` exactly as its `message_end` has it.
#[tokio::test]
async fn the_readmes_rebuild_rule_gives_back_every_message_of_a_run() {
    let scratch = Scratch::new();
    let agent = echo_agent(&scratch);
    let server = MockServer::start().await;
    server.push(MockResponse::sse(
        [
            sse::openai_delta(json!({"role": "assistant", "content": ""})),
            sse::openai_delta(json!({"reasoning_content": "They want "})),
            sse::openai_delta(json!({"reasoning_content": "an \"echo\"."})),
            sse::openai_delta(json!({"content": "Calling\n"})),
            sse::openai_delta(json!({"content": " echo."})),
            sse::openai_delta(
                json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "echo", "arguments": "{\"text\":"}}]}),
            ),
            sse::openai_delta(json!({"tool_calls": [{"index": 0, "function": {"arguments": "\"ping\"}"}}]})),
            sse::openai_finish("tool_calls"),
            sse::openai_usage(10, 5),
            sse::OPENAI_DONE.to_owned(),
        ]
        .concat(),
    ));
    server.push(Dialect::OpenAi.text(&["Got ", "ping."]));
    let run = finish(Dialect::OpenAi.tiller(
        &server,
        "run",
        &[
            "--agent",
            agent.to_str().unwrap(),
            "--events",
            "jsonl",
            "Echo ping",
        ],
    ))
    .await;
    assert_eq!(run.code(), Some(0), "{}", run.stderr);
    let kinds: Vec<String> = envelopes(&run.stdout).iter().map(event_kind).collect();
    for kind in ["thinking_start", "text_delta", "tool_call_end"] {
        assert!(
            kinds.contains(&format!("message_update:{kind}")),
            "{kinds:?}"
        );
    }

    let block = |fence: &str| readme_block("### Rebuilding a message", fence);
    let js = format!(
        "{}\n{}",
        block("js"),
        r#"
const lines = require("fs").readFileSync(0, "utf8").trim().split("\n").map(JSON.parse);
let message, rebuilt = 0;
for (const { event } of lines) {
  message = rebuild(message, event);
  if (event.type === "message_end" && event.message.role === "assistant") {
    const want = JSON.stringify(event.message.content), got = JSON.stringify(message.content);
    if (want !== got) throw new Error(`rebuilt ${got}, not ${want}`);
    rebuilt += 1;
  }
}
console.log(rebuilt);
"#
    );
    let python = format!(
        "{}\n{}",
        block("python"),
        r#"
import json, sys
message, rebuilt = None, 0
for line in sys.stdin:
    event = json.loads(line)["event"]
    message = rebuild(message, event)
    if event["type"] == "message_end" and event["message"]["role"] == "assistant":
        assert message["content"] == event["message"]["content"], (message, event)
        rebuilt += 1
print(rebuilt)
"#
    );
    for (program, flag, code) in [("node", "-e", js), ("python3", "-c", python)] {
        let mut command = tokio::process::Command::new(program);
        command
            .args([flag, &code])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let done = common::finish_with_input(command, run.stdout.as_bytes()).await;
        assert_eq!(
            (done.code(), done.stdout.trim()),
            (Some(0), "2"),
            "{program}: {}",
            done.stderr
        );
    }
}
