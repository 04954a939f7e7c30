//! Callers known by JSON Web Tokens: HS256 with a shared secret, RS256 and ES256
//! with an issuer's public key; the claims give tenant, user and client; an
//! expired, not-yet-valid, forged or misaddressed token is 401; the static token
//! file keeps working beside them.

#![allow(clippy::unwrap_used)]

mod support;

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use pretty_assertions::assert_eq;
use reqwest::Method;
use serde_json::{Value, json};
use support::Running;
use tiller::faux::{FauxProvider, FauxTurn};
use tiller_server::{JwtKeys, Owner, ServerConfig, Tokens};

const SECRET: &[u8] = b"a shared secret of the issuer and the server";

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A token over `claims` signed with `key` by `algorithm`.
fn sign(algorithm: Algorithm, key: &EncodingKey, claims: Value) -> String {
    jsonwebtoken::encode(&Header::new(algorithm), &claims, key).unwrap()
}

fn hs256(claims: Value) -> String {
    sign(Algorithm::HS256, &EncodingKey::from_secret(SECRET), claims)
}

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(format!(
        "{}/tests/fixtures/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

fn config(keys: JwtKeys) -> ServerConfig {
    ServerConfig {
        tokens: Tokens::new()
            .with(
                "static-token",
                Owner {
                    tenant: "initech".into(),
                    user: None,
                    metrics: false,
                    admin: false,
                },
            )
            .with_jwt(keys),
        ..ServerConfig::default()
    }
}

/// The context of an agent the bearer of `token` creates, or the status of the
/// refusal.
async fn context_of(server: &Running, token: &str) -> Result<Value, u16> {
    let (status, created) = server
        .send_as(
            Method::POST,
            "/agents",
            Some(token),
            Some(json!({"definition": "helper"})),
        )
        .await;
    if status != 201 {
        return Err(status);
    }
    let id = created["id"].as_str().unwrap().to_owned();
    let (_, state) = server
        .send_as(Method::GET, &format!("/agents/{id}"), Some(token), None)
        .await;
    let mut context = state["context"].clone();
    context.as_object_mut().unwrap().remove("session_id");
    Ok(context)
}

#[tokio::test]
async fn an_hs256_tokens_claims_say_who_calls_and_a_bad_token_is_401() {
    let faux = FauxProvider::new();
    faux.push(FauxTurn::text("Hello."));
    let keys = JwtKeys::hs256(SECRET)
        .with_issuer("https://auth.example.com")
        .with_audience("tiller");
    let server = Running::start(&faux, config(keys)).await;
    let good = json!({
        "iss": "https://auth.example.com",
        "aud": "tiller",
        "exp": now() + 600,
        "nbf": now() - 10,
        "tenant_id": "acme",
        "user_id": "alice",
        "client_id": "mobile",
    });
    assert_eq!(
        context_of(&server, &hs256(good.clone())).await,
        Ok(json!({"tenant_id": "acme", "user_id": "alice", "client_id": "mobile"}))
    );

    // No tenant claim: the default tenant; `sub` names the user.
    let mut plain = good.clone();
    for claim in ["tenant_id", "user_id", "client_id"] {
        plain.as_object_mut().unwrap().remove(claim);
    }
    plain["sub"] = json!("bob");
    assert_eq!(
        context_of(&server, &hs256(plain)).await,
        Ok(json!({"tenant_id": "default", "user_id": "bob"}))
    );

    // Each way a token can be wrong is 401.
    let changed = |claim: &str, value: Value| {
        let mut claims = good.clone();
        claims[claim] = value;
        hs256(claims)
    };
    let without = |claim: &str| {
        let mut claims = good.clone();
        claims.as_object_mut().unwrap().remove(claim);
        hs256(claims)
    };
    let wrong = [
        ("expired", changed("exp", json!(now() - 3_600))),
        // No minute of grace by default (the library's own default is 60 s).
        ("expired five seconds ago", changed("exp", json!(now() - 5))),
        // Longer-lived than a day, counted from now or from its issue.
        ("lives ten days", changed("exp", json!(now() + 10 * 86_400))),
        (
            "issued to live two days",
            changed("iat", json!(now() - 86_400)),
        ),
        ("not yet valid", changed("nbf", json!(now() + 3_600))),
        (
            "another issuer",
            changed("iss", json!("https://evil.example.com")),
        ),
        ("another audience", changed("aud", json!("someone-else"))),
        ("no expiry", without("exp")),
        ("no issuer", without("iss")),
        ("no audience", without("aud")),
        (
            "forged",
            sign(
                Algorithm::HS256,
                &EncodingKey::from_secret(b"a guess"),
                good.clone(),
            ),
        ),
        ("not a token", "not.a.token".to_owned()),
    ];
    for (why, token) in wrong {
        let (status, problem) = server
            .send_as(Method::GET, "/agents", Some(&token), None)
            .await;
        assert_eq!(
            (status, &problem["type"]),
            (401, &json!("urn:tiller:problem:unauthorized")),
            "{why}"
        );
    }

    // The token file works beside the keys.
    assert_eq!(
        context_of(&server, "static-token").await,
        Ok(json!({"tenant_id": "initech"}))
    );
    // A tenant sees its own agents only, whichever kind of token says so.
    let (_, listed) = server
        .send_as(Method::GET, "/agents", Some(&hs256(good)), None)
        .await;
    assert_eq!(listed.as_array().unwrap().len(), 1);
    server.stop().await;
}

/// RS256 and ES256 tokens checked with the issuer's public key; a token signed
/// by another key, or with the shared-secret algorithm over the public key, is 401.
#[tokio::test]
async fn rs256_and_es256_tokens_are_checked_with_the_public_key() {
    for (algorithm, private, public) in [
        (
            Algorithm::RS256,
            "jwt-rs256-private.pem",
            "jwt-rs256-public.pem",
        ),
        (
            Algorithm::ES256,
            "jwt-es256-private.pem",
            "jwt-es256-public.pem",
        ),
    ] {
        let faux = FauxProvider::new();
        let keys = JwtKeys::from_public_key_pem(&fixture(public)).unwrap();
        let server = Running::start(&faux, config(keys)).await;
        let signing = match algorithm {
            Algorithm::RS256 => EncodingKey::from_rsa_pem(&fixture(private)).unwrap(),
            _ => EncodingKey::from_ec_pem(&fixture(private)).unwrap(),
        };
        let claims = json!({"exp": now() + 600, "tenant_id": "acme", "sub": "carol"});
        assert_eq!(
            context_of(&server, &sign(algorithm, &signing, claims.clone())).await,
            Ok(json!({"tenant_id": "acme", "user_id": "carol"})),
            "{algorithm:?}"
        );
        let other = match algorithm {
            Algorithm::RS256 => {
                EncodingKey::from_ec_pem(&fixture("jwt-es256-private.pem")).unwrap()
            }
            _ => EncodingKey::from_rsa_pem(&fixture("jwt-rs256-private.pem")).unwrap(),
        };
        let other_algorithm = if algorithm == Algorithm::RS256 {
            Algorithm::ES256
        } else {
            Algorithm::RS256
        };
        let confused = sign(
            Algorithm::HS256,
            &EncodingKey::from_secret(&fixture(public)),
            claims.clone(),
        );
        for token in [sign(other_algorithm, &other, claims.clone()), confused] {
            assert_eq!(context_of(&server, &token).await, Err(401), "{algorithm:?}");
        }
        server.stop().await;
    }
    assert!(JwtKeys::from_public_key_pem(b"not a key").is_err());
}
