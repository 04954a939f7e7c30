//! Who a Bedrock request is from, and where it goes.
//!
//! - **Region**: the one in a regional endpoint's host
//!   (`bedrock-runtime.{region}.amazonaws.com`) the model names, else
//!   `AWS_REGION`, else `AWS_DEFAULT_REGION`, else `us-east-1`. A model at the
//!   catalog's endpoint goes to its region's.
//! - **Credentials**: `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY` (with
//!   `AWS_SESSION_TOKEN`), else the profile `AWS_PROFILE` (or `default`) of the
//!   shared credentials file (`AWS_SHARED_CREDENTIALS_FILE`, else
//!   `~/.aws/credentials`), read at each request so rotated keys are picked up.
//!   The request is signed with SigV4 for the service `bedrock` by `aws-sigv4`.
//! - **A Bedrock API key** ([`Transport::api_key`](crate::Transport::api_key), else
//!   `AWS_BEARER_TOKEN_BEDROCK`) is sent as a bearer token instead of a signature.
//!
//! Credentials from the environment or the file go only to Bedrock's own runtime
//! endpoints (regional, FIPS or a VPC endpoint) or to this machine (a loopback
//! address): a model at any other host gets [`StreamError::KeyWithheld`], unless
//! the caller passes a Bedrock API key itself.
//! Secrets never reach an error message: a missing credential names the
//! variables and the file to set, nothing more.

use std::path::PathBuf;
use std::time::SystemTime;

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign as sigv4};
use aws_sigv4::sign::v4;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

use crate::error::StreamError;
use crate::model::Model;
use crate::options::{ApiKey, StreamOptions};

/// The endpoint the catalog gives Bedrock's models.
pub(crate) const DEFAULT_ENDPOINT: &str = "https://bedrock-runtime.us-east-1.amazonaws.com";

/// Where credentials are said to be missing from.
const WHERE_CREDENTIALS_LIVE: &str =
    "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or a profile in ~/.aws/credentials (AWS_PROFILE)";

/// The region a request is signed for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Region(String);

impl Region {
    /// The region for `model`, from the environment or its endpoint.
    pub(crate) fn for_model(model: &Model) -> Region {
        Self::from_sources(|name| std::env::var(name).ok(), &model.base_url)
    }

    fn from_sources(var: impl Fn(&str) -> Option<String>, base_url: &str) -> Region {
        let from_host = || {
            if base_url.trim_end_matches('/') == DEFAULT_ENDPOINT {
                return None;
            }
            let host = reqwest::Url::parse(base_url).ok()?.host_str()?.to_owned();
            let region = host
                .strip_prefix("bedrock-runtime.")?
                .strip_suffix(".amazonaws.com")?;
            Some(region.split('.').next()?.to_owned())
        };
        let named = || {
            ["AWS_REGION", "AWS_DEFAULT_REGION"]
                .into_iter()
                .filter_map(&var)
                .map(|region| region.trim().to_owned())
                .find(|region| !region.is_empty())
        };
        Region(
            from_host()
                .or_else(named)
                .unwrap_or_else(|| "us-east-1".to_owned()),
        )
    }

    /// The regional endpoint when `base_url` is the catalog's default and the
    /// region is another; `None` keeps `base_url`.
    pub(crate) fn endpoint_for(&self, base_url: &str) -> Option<String> {
        (base_url.trim_end_matches('/') == DEFAULT_ENDPOINT && self.0 != "us-east-1")
            .then(|| format!("https://bedrock-runtime.{}.amazonaws.com", self.0))
    }
}

/// A Bedrock API key: the one given, else `AWS_BEARER_TOKEN_BEDROCK` (for AWS or
/// this machine only).
pub(crate) fn api_key(
    model: &Model,
    options: &StreamOptions,
) -> Result<Option<ApiKey>, StreamError> {
    if let Some(key) = &options.transport.api_key {
        return Ok(Some(key.clone()));
    }
    let Some(key) = ApiKey::from_env("AWS_BEARER_TOKEN_BEDROCK") else {
        return Ok(None);
    };
    trusted(model, "AWS_BEARER_TOKEN_BEDROCK")?;
    Ok(Some(key))
}

/// Whether credentials from the environment may go to `model`'s host: Bedrock's
/// own runtime endpoints (`bedrock-runtime[-fips].{region}.amazonaws.com[.cn]`, or
/// a VPC endpoint `….bedrock-runtime.{region}.vpce.amazonaws.com`), or this
/// machine (a loopback address, which the user runs).
fn trusted(model: &Model, source: &str) -> Result<(), StreamError> {
    let url = reqwest::Url::parse(&model.base_url).ok();
    let host = url
        .as_ref()
        .and_then(|url| url.host_str())
        .map(str::to_ascii_lowercase);
    if host.as_deref().is_some_and(is_trusted_host) {
        return Ok(());
    }
    Err(StreamError::KeyWithheld {
        provider: model.provider.clone(),
        env_var: source.to_owned(),
        host: host.unwrap_or_else(|| "an invalid address".to_owned()),
    })
}

fn is_trusted_host(host: &str) -> bool {
    let ip = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = ip.parse::<std::net::IpAddr>() {
        return ip.is_loopback();
    }
    if host == "localhost" {
        return true;
    }
    let Some(name) = host
        .strip_suffix(".amazonaws.com")
        .or_else(|| host.strip_suffix(".amazonaws.com.cn"))
    else {
        return false;
    };
    let labels: Vec<&str> = name.split('.').collect();
    let runtime = |label: &str| label == "bedrock-runtime" || label == "bedrock-runtime-fips";
    match labels.as_slice() {
        [service, _region] => runtime(service),
        [_endpoint @ .., service, _region, "vpce"] => runtime(service),
        _ => false,
    }
}

/// Signs a request to `model` (its `url`, `headers` and `body`) with SigV4 for
/// `region`, adding its `authorization`, `x-amz-date` and (for temporary
/// credentials) `x-amz-security-token` headers, in place of any earlier ones.
pub(crate) fn sign(
    url: &str,
    headers: &mut HeaderMap,
    body: &[u8],
    region: &Region,
    model: &Model,
) -> Result<(), StreamError> {
    let credentials =
        credentials(|name| std::env::var(name).ok()).ok_or_else(|| StreamError::MissingApiKey {
            provider: model.provider.clone(),
            env_var: WHERE_CREDENTIALS_LIVE.to_owned(),
        })?;
    trusted(model, "AWS credentials")?;
    let identity = credentials.into();
    let invalid = |message: String| StreamError::InvalidRequest { message };
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(&region.0)
        .name("bedrock")
        .time(SystemTime::now())
        .settings(SigningSettings::default())
        .build()
        .map_err(|error| invalid(format!("cannot sign the request: {error}")))?
        .into();
    for stale in ["authorization", "x-amz-date", "x-amz-security-token"] {
        headers.remove(stale);
    }
    let signed_headers: Vec<(&str, &str)> = headers
        .iter()
        .filter_map(|(name, value)| Some((name.as_str(), value.to_str().ok()?)))
        .collect();
    let signable = SignableRequest::new(
        "POST",
        url,
        signed_headers.into_iter(),
        SignableBody::Bytes(body),
    )
    .map_err(|error| invalid(format!("cannot sign the request: {error}")))?;
    let (instructions, _) = sigv4(signable, &params)
        .map_err(|error| invalid(format!("cannot sign the request: {error}")))?
        .into_parts();
    let mut added = Vec::new();
    for (name, value) in instructions.headers() {
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| invalid(format!("the signature's header `{name}` is not valid")))?;
        let mut value = HeaderValue::from_str(value)
            .map_err(|_| invalid(format!("the signature's header `{name}` is not valid")))?;
        value.set_sensitive(true);
        added.push((name, value));
    }
    for (name, value) in added {
        headers.insert(name, value);
    }
    Ok(())
}

/// The credentials `var` and the shared credentials file hold, if any.
fn credentials(var: impl Fn(&str) -> Option<String>) -> Option<Credentials> {
    let set = |name: &str| {
        var(name)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    if let (Some(id), Some(secret)) = (set("AWS_ACCESS_KEY_ID"), set("AWS_SECRET_ACCESS_KEY")) {
        return Some(Credentials::new(
            id,
            secret,
            set("AWS_SESSION_TOKEN"),
            None,
            "environment",
        ));
    }
    let path = set("AWS_SHARED_CREDENTIALS_FILE")
        .map(PathBuf::from)
        .or_else(|| Some(PathBuf::from(set("HOME")?).join(".aws/credentials")))?;
    let text = std::fs::read_to_string(path).ok()?;
    let profile = set("AWS_PROFILE").unwrap_or_else(|| "default".to_owned());
    let field = |key: &str| profile_field(&text, &profile, key);
    Some(Credentials::new(
        field("aws_access_key_id")?,
        field("aws_secret_access_key")?,
        field("aws_session_token"),
        None,
        "shared credentials file",
    ))
}

/// `key` of the section `[profile]` in an INI file's `text`.
fn profile_field(text: &str, profile: &str, key: &str) -> Option<String> {
    let mut in_profile = false;
    for line in text.lines() {
        let line = line.trim();
        if let Some(section) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            in_profile = section.trim() == profile;
        } else if in_profile
            && let Some((name, value)) = line.split_once('=')
            && name.trim() == key
        {
            return Some(value.trim().to_owned()).filter(|v| !v.is_empty());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_region_comes_from_a_regional_endpoint_else_the_environment() {
        let none = |_: &str| None;
        assert_eq!(Region::from_sources(none, DEFAULT_ENDPOINT).0, "us-east-1");
        let host = "https://bedrock-runtime.eu-west-3.amazonaws.com";
        assert_eq!(Region::from_sources(none, host).0, "eu-west-3");
        let named = |name: &str| (name == "AWS_DEFAULT_REGION").then(|| "ap-south-1".to_owned());
        assert_eq!(Region::from_sources(named, host).0, "eu-west-3");
        assert_eq!(
            Region::from_sources(named, "http://127.0.0.1:9").0,
            "ap-south-1"
        );
        let region = Region::from_sources(named, DEFAULT_ENDPOINT);
        assert_eq!(region.0, "ap-south-1");
        assert_eq!(
            region.endpoint_for(DEFAULT_ENDPOINT).as_deref(),
            Some("https://bedrock-runtime.ap-south-1.amazonaws.com")
        );
        assert_eq!(region.endpoint_for("http://127.0.0.1:9"), None);
    }

    #[test]
    fn credentials_from_the_environment_go_to_bedrock_or_this_machine_only() {
        let at = |url: &str| Model::speaking(crate::Api::BedrockConverseStream, url, "m");
        for url in [
            DEFAULT_ENDPOINT,
            "https://bedrock-runtime-fips.us-west-2.amazonaws.com",
            "https://vpce-0a1b-xyz.bedrock-runtime.eu-west-1.vpce.amazonaws.com",
            "https://bedrock-runtime.cn-north-1.amazonaws.com.cn",
            "http://127.0.0.1:9",
            "http://localhost:9",
            "http://[::1]:9",
        ] {
            assert_eq!(trusted(&at(url), "AWS credentials"), Ok(()), "{url}");
        }
        for url in [
            "https://amazonaws.com.evil.example",
            "https://abc123.execute-api.us-east-1.amazonaws.com",
            "https://ec2-1-2-3-4.compute-1.amazonaws.com",
            "https://bedrock-runtime.evil.example",
            "http://10.0.0.2",
            "not a url",
        ] {
            assert!(
                matches!(
                    trusted(&at(url), "AWS credentials"),
                    Err(StreamError::KeyWithheld { .. })
                ),
                "{url}"
            );
        }
    }

    #[test]
    fn credentials_come_from_the_environment_else_the_profile() {
        let env = |name: &str| match name {
            "AWS_ACCESS_KEY_ID" => Some("AKID".to_owned()),
            "AWS_SECRET_ACCESS_KEY" => Some("secret".to_owned()),
            _ => None,
        };
        let found = credentials(env).unwrap();
        assert_eq!(
            (found.access_key_id(), found.session_token()),
            ("AKID", None)
        );

        let dir = std::env::temp_dir().join(format!("tiller-aws-{}", crate::new_id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("credentials");
        std::fs::write(
            &file,
            "[default]\naws_access_key_id = DEFAULT\naws_secret_access_key = d\n\n[work]\naws_access_key_id=WORK\naws_secret_access_key=w\naws_session_token = tok\n",
        )
        .unwrap();
        let shared = |profile: Option<&'static str>| {
            let file = file.clone();
            move |name: &str| match name {
                "AWS_SHARED_CREDENTIALS_FILE" => Some(file.display().to_string()),
                "AWS_PROFILE" => profile.map(str::to_owned),
                _ => None,
            }
        };
        let work = credentials(shared(Some("work"))).unwrap();
        assert_eq!(
            (
                work.access_key_id(),
                work.secret_access_key(),
                work.session_token()
            ),
            ("WORK", "w", Some("tok"))
        );
        assert_eq!(
            credentials(shared(None)).unwrap().access_key_id(),
            "DEFAULT"
        );
        assert!(credentials(shared(Some("nobody"))).is_none());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
