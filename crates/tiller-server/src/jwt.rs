//! Who is calling, from a JSON Web Token: `Authorization: Bearer JWT`, signed with
//! a shared secret (HS256) or an issuer's key pair (RS256 or ES256, the public key
//! given as PEM).
//!
//! A token is accepted when its signature holds, it has not expired (`exp`, which
//! it must have), it is already valid (`nbf`, when it has one), it lives no
//! longer than the server's maximum ([`JwtKeys::DEFAULT_MAX_LIFETIME`] from its
//! `iat`, or from now when it has none), and, when the server names them, it
//! has an issuer (`iss`) and an audience (`aud`) and they are the server's;
//! anything else is 401. Times are taken as they are ([`JwtKeys::with_leeway`]
//! allows a clock skew; none by default). Its claims give the caller: `tenant_id` (the tenant,
//! [`DEFAULT_TENANT`](tiller::run::DEFAULT_TENANT) when it has none), `user_id` (else
//! `sub`) and `client_id`. The static token file works beside it: a token it lists
//! is taken first.

use std::fmt;
use std::path::Path;
use std::time::Duration;

use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;

/// How JSON Web Tokens are checked: the key, its algorithm, and the issuer and
/// audience they must name.
#[derive(Clone)]
pub struct JwtKeys {
    key: DecodingKey,
    validation: Validation,
    /// The longest a token may live.
    max_lifetime: Duration,
}

/// The claims that say who the caller is.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub(crate) struct Identity {
    /// The tenant.
    #[serde(default)]
    pub(crate) tenant_id: Option<String>,
    /// The user.
    #[serde(default)]
    pub(crate) user_id: Option<String>,
    /// The subject: the user when `user_id` is absent.
    #[serde(default)]
    pub(crate) sub: Option<String>,
    /// The application or device.
    #[serde(default)]
    pub(crate) client_id: Option<String>,
    /// When it expires, in seconds since the Unix epoch.
    #[serde(default)]
    pub(crate) exp: u64,
    /// When it was issued.
    #[serde(default)]
    pub(crate) iat: Option<u64>,
}

impl fmt::Debug for JwtKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the key.
        f.debug_struct("JwtKeys")
            .field("algorithms", &self.validation.algorithms)
            .field("issuer", &self.validation.iss)
            .field("audience", &self.validation.aud)
            .field("leeway_s", &self.validation.leeway)
            .field("max_lifetime", &self.max_lifetime)
            .finish_non_exhaustive()
    }
}

impl JwtKeys {
    /// The longest a token may live by default: a day.
    pub const DEFAULT_MAX_LIFETIME: Duration = Duration::from_secs(24 * 60 * 60);

    /// Tokens signed with `secret` (HS256).
    pub fn hs256(secret: &[u8]) -> Self {
        JwtKeys::with(DecodingKey::from_secret(secret), Algorithm::HS256)
    }

    /// Tokens signed with the private half of this public key (PEM): RS256 for an
    /// RSA key, ES256 for a P-256 one.
    pub fn from_public_key_pem(pem: &[u8]) -> Result<Self, String> {
        if let Ok(key) = DecodingKey::from_rsa_pem(pem) {
            return Ok(JwtKeys::with(key, Algorithm::RS256));
        }
        DecodingKey::from_ec_pem(pem)
            .map(|key| JwtKeys::with(key, Algorithm::ES256))
            .map_err(|_| "expected an RSA or a P-256 public key in PEM form".to_owned())
    }

    /// Reads the secret from the environment variable `variable` (HS256).
    pub fn hs256_from_env(variable: &str) -> Result<Self, String> {
        match std::env::var(variable) {
            Ok(secret) if !secret.trim().is_empty() => Ok(JwtKeys::hs256(secret.trim().as_bytes())),
            _ => Err(format!(
                "{variable} is not set: it should hold the JWT secret"
            )),
        }
    }

    /// Reads the public key from the PEM file at `path`.
    pub fn public_key_file(path: &Path) -> Result<Self, String> {
        let pem = std::fs::read(path)
            .map_err(|error| format!("cannot read {}: {error}", path.display()))?;
        JwtKeys::from_public_key_pem(&pem).map_err(|error| format!("{}: {error}", path.display()))
    }

    fn with(key: DecodingKey, algorithm: Algorithm) -> Self {
        let mut validation = Validation::new(algorithm);
        validation.validate_nbf = true;
        validation.validate_aud = false;
        // An expired token is expired: no minute of grace unless asked.
        validation.leeway = 0;
        JwtKeys {
            key,
            validation,
            max_lifetime: JwtKeys::DEFAULT_MAX_LIFETIME,
        }
    }

    /// Tokens `seconds` past their `exp` (or before their `nbf`) still taken:
    /// the clock skew allowed between the issuer and this server.
    pub fn with_leeway(mut self, seconds: u64) -> Self {
        self.validation.leeway = seconds;
        self
    }

    /// Only tokens that live at most `lifetime` (from their `iat`, or from now).
    pub fn with_max_lifetime(mut self, lifetime: Duration) -> Self {
        self.max_lifetime = lifetime;
        self
    }

    /// Only tokens issued by `issuer` (`iss`).
    pub fn with_issuer(mut self, issuer: &str) -> Self {
        self.validation.set_issuer(&[issuer]);
        self.validation
            .required_spec_claims
            .insert("iss".to_owned());
        self
    }

    /// Only tokens meant for `audience` (`aud`).
    pub fn with_audience(mut self, audience: &str) -> Self {
        self.validation.set_audience(&[audience]);
        self.validation.validate_aud = true;
        self.validation
            .required_spec_claims
            .insert("aud".to_owned());
        self
    }

    /// The caller `token` names, if it holds.
    pub(crate) fn verify(&self, token: &str) -> Option<Identity> {
        let identity = jsonwebtoken::decode::<Identity>(token, &self.key, &self.validation)
            .ok()?
            .claims;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_secs());
        let since = identity.iat.unwrap_or(now).min(now);
        let lives = identity.exp.saturating_sub(since);
        (lives <= self.max_lifetime.as_secs()).then_some(identity)
    }
}
