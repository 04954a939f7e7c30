//! Who is calling: bearer tokens mapped to tenants, or JSON Web Tokens whose
//! claims name them (see [`crate::jwt`]).
//!
//! With tokens configured, every route but `/healthz` and the dashboard's page
//! (`/`, static HTML that holds no data and asks for a token) needs
//! `Authorization: Bearer TOKEN` (401 otherwise); `/metrics`, whose figures cover
//! every tenant, needs a token marked `metrics: true` (403 otherwise). An agent created with a token belongs to the token's
//! tenant (and user), which its `AgentContext` says; every other tenant's requests
//! find no such agent (404, so nothing is learnt of its existence) and their lists
//! leave it out. `X-User-Id`-style headers add to the caller's context only when the
//! server is told to trust them (behind a gateway that sets them): the tenant is
//! always the token's. Without tokens the server is open: one tenant, no
//! authentication, for loopback use.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::Path;

use axum::http::{HeaderMap, StatusCode, header};
use serde::Deserialize;
use tiller::run::Budget;
use tiller::{AgentContext, run::DEFAULT_TENANT};

use crate::error::Problem;
use crate::jwt::JwtKeys;
use crate::quota::Quotas;

/// Bearer tokens and the tenants they stand for, and the keys JSON Web Tokens
/// are checked with.
#[derive(Clone, Default)]
pub struct Tokens {
    by_token: HashMap<String, Owner>,
    jwt: Option<JwtKeys>,
    /// What each tenant's agents may spend together, by tenant.
    budgets: BTreeMap<String, Budget>,
    /// Each tenant's own quotas and its users' (see [`Quotas`]).
    quotas: HashMap<String, (Quotas, Quotas)>,
    /// Each tenant's share of a provider account's turns, when not 1.
    weights: BTreeMap<String, u32>,
}

/// A tenant and, optionally, a user of it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Owner {
    /// The tenant.
    pub tenant: String,
    /// The user, when the token is a user's.
    #[serde(default)]
    pub user: Option<String>,
    /// Whether the token may read `/metrics`, the server's figures over every
    /// tenant: an operator's token, for a scraper (`metrics: true`).
    #[serde(default)]
    pub metrics: bool,
    /// Whether the token may act on the server itself (`POST /admin/drain`): an
    /// operator's (`admin: true`); reading the metrics gives no such right.
    #[serde(default)]
    pub admin: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenFile {
    tokens: Vec<TokenEntry>,
    #[serde(default)]
    tenants: BTreeMap<String, TenantEntry>,
}

/// What the token file says of a tenant.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantEntry {
    /// What its agents may spend together (see [`tiller::run::budget`]).
    #[serde(default)]
    budget: Budget,
    /// Its share of each provider account's turns (1 by default).
    #[serde(default)]
    weight: Option<u32>,
    /// What the tenant may hold at once, where not the server's default.
    #[serde(default)]
    quotas: Quotas,
    /// What each of its users may hold at once, where not the server's default.
    #[serde(default)]
    user_quotas: Quotas,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    token: String,
    #[serde(flatten)]
    owner: Owner,
}

impl fmt::Debug for Tokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the tokens themselves.
        f.debug_struct("Tokens")
            .field("count", &self.by_token.len())
            .field("jwt", &self.jwt)
            .finish()
    }
}

impl Tokens {
    /// No tokens.
    pub fn new() -> Self {
        Tokens::default()
    }

    /// These tokens and `token` for `owner`.
    pub fn with(mut self, token: impl Into<String>, owner: Owner) -> Self {
        self.by_token.insert(token.into(), owner);
        self
    }

    /// Reads a token file (YAML or JSON): `tokens: [{token: …, tenant: …, user: …,
    /// metrics: true, admin: true}]` (`user`, `metrics` and `admin` optional),
    /// and optionally, by
    /// tenant, its budget, its weight (its share of each provider account's
    /// turns) and its quotas and its users': `tenants: {acme: {budget:
    /// {total_tokens: 1000000, cost_usd: 50}, weight: 2, quotas: {agents: 50},
    /// user_quotas: {sessions: 500}}}`.
    pub fn load(path: impl AsRef<Path>) -> Result<Tokens, String> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|error| format!("cannot read {}: {error}", path.display()))?;
        let file: TokenFile = serde_saphyr::from_str(&text)
            .map_err(|error| format!("{}: {error}", path.display()))?;
        let mut tokens = Tokens::new();
        for (tenant, entry) in file.tenants {
            if entry.weight == Some(0) {
                return Err(format!(
                    "{}: tenants.{tenant}.weight: at least 1",
                    path.display()
                ));
            }
            if let Some(weight) = entry.weight {
                tokens.weights.insert(tenant.clone(), weight);
            }
            if !entry.budget.is_unbounded() {
                tokens = tokens.with_budget(tenant.clone(), entry.budget);
            }
            let per_user = entry.user_quotas;
            if per_user.trigger_windows.is_some()
                || per_user.trigger_bytes.is_some()
                || per_user.streams.is_some()
                || per_user.mcp_sessions.is_some()
            {
                return Err(format!(
                    "{}: tenants.{tenant}.user_quotas: a user's quotas are `agents` and `sessions` (its streams are bounded per token by the server; trigger windows and MCP sessions by its tenant's quotas)",
                    path.display()
                ));
            }
            tokens = tokens.with_quotas(tenant, entry.quotas, per_user);
        }
        for entry in file.tokens {
            if entry.token.trim().is_empty() {
                return Err(format!("{}: a token is empty", path.display()));
            }
            tokens = tokens.with(entry.token, entry.owner);
        }
        Ok(tokens)
    }

    /// These tokens, with `budget` for what `tenant`'s agents spend together.
    pub fn with_budget(mut self, tenant: impl Into<String>, budget: Budget) -> Self {
        self.budgets.insert(tenant.into(), budget);
        self
    }

    /// Each tenant's budget, by tenant, for
    /// [`Supervisor::set_tenant_budget`](tiller::Supervisor::set_tenant_budget)
    /// (`tiller serve` sets them before it serves).
    pub fn budgets(&self) -> impl Iterator<Item = (&str, &Budget)> {
        self.budgets
            .iter()
            .map(|(tenant, budget)| (tenant.as_str(), budget))
    }

    /// These tokens, with `tenant`'s own quotas and its users' (each bound left
    /// `None` is the server's default).
    pub fn with_quotas(
        mut self,
        tenant: impl Into<String>,
        tenant_quotas: Quotas,
        user_quotas: Quotas,
    ) -> Self {
        self.quotas
            .insert(tenant.into(), (tenant_quotas, user_quotas));
        self
    }

    /// `tenant`'s own quotas and its users', as the token file gives them.
    pub fn quotas(&self, tenant: &str) -> (Quotas, Quotas) {
        self.quotas.get(tenant).copied().unwrap_or_default()
    }

    /// Each tenant's share of a provider account's turns, where not 1, for
    /// [`RateLimits::set_weight`](tiller::ai::RateLimits::set_weight).
    pub fn weights(&self) -> impl Iterator<Item = (&str, u32)> {
        self.weights
            .iter()
            .map(|(tenant, weight)| (tenant.as_str(), *weight))
    }

    /// These tokens, and JSON Web Tokens checked with `keys` beside them.
    pub fn with_jwt(mut self, keys: JwtKeys) -> Self {
        self.jwt = Some(keys);
        self
    }

    /// Whether no token and no JWT key is configured (the server is open).
    pub fn is_empty(&self) -> bool {
        self.by_token.is_empty() && self.jwt.is_none()
    }

    /// Who `token` stands for: the token file's owner, else a valid JWT's claims
    /// (with the client id they name).
    fn owner(&self, token: &str) -> Option<(Owner, Option<String>)> {
        if let Some(owner) = self.by_token.get(token) {
            return Some((owner.clone(), None));
        }
        let identity = self.jwt.as_ref()?.verify(token)?;
        let owner = Owner {
            tenant: identity
                .tenant_id
                .filter(|tenant| !tenant.is_empty())
                .unwrap_or_else(|| DEFAULT_TENANT.to_owned()),
            user: identity.user_id.or(identity.sub),
            metrics: false,
            admin: false,
        };
        Some((owner, identity.client_id))
    }
}

/// Whose something is, and what a caller may see: a tenant (`None` on an open
/// server) and, within it, a user.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub(crate) struct Scope {
    /// The tenant.
    pub(crate) tenant: Option<String>,
    /// The user, when the token (or a trusted `X-User-Id`) names one.
    pub(crate) user: Option<String>,
}

impl Scope {
    /// Whether a caller of this scope may see what `owner` owns: its tenant's,
    /// and only its own when the caller is a user.
    pub(crate) fn sees(&self, owner: &Scope) -> bool {
        self.tenant == owner.tenant && (self.user.is_none() || self.user == owner.user)
    }
}

/// The caller of a request.
pub(crate) struct Caller {
    /// The tenant, `None` on an open server.
    pub(crate) tenant: Option<String>,
    /// Who agents it creates work for.
    pub(crate) context: AgentContext,
    /// Whether it may read `/metrics` (always on an open server).
    pub(crate) reads_metrics: bool,
    /// Whether it may act on the server itself (always on an open server).
    pub(crate) admin: bool,
    /// Who its token says it is (tenant, and user), whatever headers add: what
    /// its quotas count against.
    pub(crate) token_holder: Scope,
}

impl Caller {
    /// What the caller may see, and owns what it creates.
    pub(crate) fn scope(&self) -> Scope {
        Scope {
            tenant: self.tenant.clone(),
            user: self.context.ids().user_id.clone(),
        }
    }
}

/// The caller `headers` say: by its bearer token when tokens are configured; with
/// the context headers added when `trust_headers`.
pub(crate) fn caller(
    tokens: &Tokens,
    trust_headers: bool,
    headers: &HeaderMap,
) -> Result<Caller, Problem> {
    let mut context = if trust_headers {
        AgentContext::from_headers(
            headers
                .iter()
                .filter_map(|(name, value)| Some((name.as_str(), value.to_str().ok()?))),
        )
    } else {
        AgentContext::new()
    };
    if tokens.is_empty() {
        return Ok(Caller {
            tenant: None,
            context,
            reads_metrics: true,
            admin: true,
            token_holder: Scope::default(),
        });
    }
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(str::trim);
    let (owner, client) = token.and_then(|token| tokens.owner(token)).ok_or_else(|| {
        Problem::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "this server needs `Authorization: Bearer TOKEN` with a token it knows or a valid JWT",
        )
    })?;
    context = context.with_tenant_id(owner.tenant.clone());
    if let Some(user) = &owner.user {
        context = context.with_user_id(user.clone());
    }
    if let Some(client) = client {
        context = context.with_client_id(client);
    }
    Ok(Caller {
        tenant: Some(owner.tenant.clone()),
        context,
        reads_metrics: owner.metrics,
        admin: owner.admin,
        token_holder: Scope {
            tenant: Some(owner.tenant.clone()),
            user: owner.user.clone(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_file_gives_each_tenant_its_budget_and_refuses_unknown_bounds() {
        let folder = std::env::temp_dir().join(format!("tiller-tokens-{}", std::process::id()));
        std::fs::create_dir_all(&folder).unwrap_or_default();
        let path = folder.join("tokens.yaml");
        std::fs::write(
            &path,
            "tokens:\n  - {token: t-acme, tenant: acme}\ntenants:\n  acme: {budget: {total_tokens: 1000000, cost_usd: 50}}\n",
        )
        .unwrap_or_default();
        let tokens = Tokens::load(&path).unwrap_or_default();
        let budgets: Vec<_> = tokens.budgets().map(|(t, b)| (t.to_owned(), *b)).collect();
        assert_eq!(
            budgets,
            [(
                "acme".to_owned(),
                Budget {
                    total_tokens: Some(1_000_000),
                    cost_usd: Some(50.0),
                    ..Budget::default()
                }
            )]
        );
        std::fs::write(
            &path,
            "tokens: []\ntenants:\n  acme: {budget: {dollars: 5}}\n",
        )
        .unwrap_or_default();
        let error = Tokens::load(&path).err().unwrap_or_default();
        assert!(error.contains("unknown field `dollars`"), "{error}");
        let _ = std::fs::remove_dir_all(&folder);
    }
}
