//! Embedding models over real HTTP to a loopback server: each API's request in
//! its documented form, its answer read back in the texts' order, and each
//! failure typed.

#![allow(clippy::unwrap_used)]

mod common;

use pretty_assertions::assert_eq;
use serde_json::json;
use tiller_ai::{EmbedPurpose, EmbeddingModel, MAX_EMBED_TEXTS, StreamError};
use tiller_test_support::{MockResponse, MockServer};

#[tokio::test]
async fn openai_compatible_servers_get_one_request_and_answers_come_back_in_order() {
    let server = MockServer::start().await;
    // Out of order on the wire: `index` says whose each vector is.
    server.push(MockResponse::json(
        200,
        &json!({"object": "list", "data": [
            {"object": "embedding", "index": 1, "embedding": [0.0, 1.0]},
            {"object": "embedding", "index": 0, "embedding": [1.0, 0.0]},
        ], "model": "nomic", "usage": {"prompt_tokens": 4, "total_tokens": 4}}),
    ));
    let model = EmbeddingModel::openai_compatible(server.base_url(), "nomic").with_dimensions(2);
    let vectors = model
        .embed(
            &["cats", "dogs"],
            EmbedPurpose::Document,
            &common::options(),
        )
        .await
        .unwrap();
    assert_eq!(vectors, [vec![1.0, 0.0], vec![0.0, 1.0]]);
    let request = server.requests().remove(0);
    assert_eq!(
        (
            request.path.as_str(),
            request.header("authorization"),
            request.header("accept")
        ),
        (
            "/v1/embeddings",
            Some("Bearer test-key"),
            Some("application/json")
        )
    );
    assert_eq!(
        request.body,
        json!({"model": "nomic", "input": ["cats", "dogs"], "encoding_format": "float", "dimensions": 2})
    );
}

#[tokio::test]
async fn gemini_gets_a_batch_of_contents() {
    let server = MockServer::start().await;
    server.push(MockResponse::json(
        200,
        &json!({"embeddings": [{"values": [0.5, 0.5]}, {"values": [0.1, 0.9]}]}),
    ));
    let model = EmbeddingModel::gemini("gemini-embedding-001")
        .with_base_url(server.base_url())
        .with_dimensions(2);
    let vectors = model
        .embed(
            &["cats", "dogs"],
            EmbedPurpose::Document,
            &common::options(),
        )
        .await
        .unwrap();
    assert_eq!(vectors, [vec![0.5, 0.5], vec![0.1, 0.9]]);
    let request = server.requests().remove(0);
    assert_eq!(
        (request.path.as_str(), request.header("x-goog-api-key")),
        (
            "/v1/models/gemini-embedding-001:batchEmbedContents",
            Some("test-key")
        )
    );
    let part = |text: &str| json!({"model": "models/gemini-embedding-001", "content": {"parts": [{"text": text}]}, "taskType": "RETRIEVAL_DOCUMENT", "outputDimensionality": 2});
    assert_eq!(
        request.body,
        json!({"requests": [part("cats"), part("dogs")]})
    );
}

#[tokio::test]
async fn bedrock_invokes_titan_once_a_text_and_cohere_once_with_the_texts_purpose() {
    let server = MockServer::start().await;
    for vector in [[1.0, 0.0], [0.0, 1.0]] {
        server.push(MockResponse::json(
            200,
            &json!({"embedding": vector, "inputTextTokenCount": 1}),
        ));
    }
    let titan = EmbeddingModel::bedrock("amazon.titan-embed-text-v2:0")
        .with_base_url(server.origin())
        .with_dimensions(256);
    let vectors = titan
        .embed(
            &["cats", "dogs"],
            EmbedPurpose::Document,
            &common::options(),
        )
        .await
        .unwrap();
    assert_eq!(vectors, [vec![1.0, 0.0], vec![0.0, 1.0]]);
    let requests = server.requests();
    assert_eq!(
        requests
            .iter()
            .map(|request| (request.path.as_str(), request.body.clone()))
            .collect::<Vec<_>>(),
        [
            (
                "/model/amazon.titan-embed-text-v2%3A0/invoke",
                json!({"inputText": "cats", "dimensions": 256})
            ),
            (
                "/model/amazon.titan-embed-text-v2%3A0/invoke",
                json!({"inputText": "dogs", "dimensions": 256})
            ),
        ]
    );
    assert_eq!(requests[0].header("authorization"), Some("Bearer test-key"));

    let server = MockServer::start().await;
    server.push(MockResponse::json(
        200,
        &json!({"embeddings": [[1.0], [2.0]], "id": "x", "texts": ["cats", "dogs"]}),
    ));
    let cohere = EmbeddingModel::bedrock("cohere.embed-english-v3").with_base_url(server.origin());
    let vectors = cohere
        .embed(&["cats", "dogs"], EmbedPurpose::Query, &common::options())
        .await
        .unwrap();
    assert_eq!(vectors, [vec![1.0], vec![2.0]]);
    assert_eq!(
        server.requests()[0].body,
        json!({"texts": ["cats", "dogs"], "input_type": "search_query"})
    );
}

#[tokio::test]
async fn each_failure_is_typed_and_nothing_is_sent_for_a_bad_call() {
    let server = MockServer::start().await;
    let model = EmbeddingModel::openai_compatible(server.base_url(), "nomic");
    let options = common::options();
    let many = vec!["x"; MAX_EMBED_TEXTS + 1];
    assert!(matches!(
        model.embed(&many, EmbedPurpose::Query, &options).await,
        Err(StreamError::InvalidRequest { .. })
    ));
    assert_eq!(
        model.embed(&[], EmbedPurpose::Document, &options).await,
        Ok(vec![])
    );
    assert!(server.requests().is_empty());

    server.push(MockResponse::json(
        400,
        &json!({"error": {"message": "input is too long", "type": "invalid_request_error"}}),
    ));
    let error = model
        .embed(&["x"], EmbedPurpose::Document, &options)
        .await
        .unwrap_err();
    assert!(
        matches!(&error, StreamError::Http { status: 400, message, .. } if message == "input is too long (invalid_request_error)"),
        "{error:?}"
    );
    server.push(MockResponse::json(
        200,
        &json!({"data": [{"index": 0, "embedding": [1.0]}]}),
    ));
    assert_eq!(
        model
            .embed(&["x", "y"], EmbedPurpose::Document, &options)
            .await,
        Err(StreamError::Malformed {
            message: "openai-compatible answered 1 vectors for 2 texts".to_owned()
        })
    );
    server.push(MockResponse::json(200, &json!({"data": "nothing"})));
    assert!(matches!(
        model.embed(&["x"], EmbedPurpose::Document, &options).await,
        Err(StreamError::Malformed { .. })
    ));
}

#[tokio::test]
async fn a_key_from_the_environment_goes_to_its_providers_host_only() {
    // OPENAI_API_KEY may or may not be set here: either way no key reaches a
    // loopback server that claims to be OpenAI without one passed.
    let server = MockServer::start().await;
    server.push(MockResponse::json(
        200,
        &json!({"data": [{"index": 0, "embedding": [1.0]}]}),
    ));
    let model = EmbeddingModel::openai("text-embedding-3-small").with_base_url(server.base_url());
    match model
        .embed(
            &["x"],
            EmbedPurpose::Document,
            &tiller_ai::StreamOptions::default(),
        )
        .await
    {
        Ok(_) => assert_eq!(server.requests()[0].header("authorization"), None),
        Err(error) => assert!(
            matches!(error, StreamError::KeyWithheld { .. }),
            "{error:?}"
        ),
    }
}
