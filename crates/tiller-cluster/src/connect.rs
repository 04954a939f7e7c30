//! How a host reaches NATS: the servers' URLs (shown without their secrets),
//! the host's credentials — a user and password or a token in the URL, a
//! `.creds` file (NKey + JWT), an NKey seed file, a client certificate — and
//! TLS. A bus off this machine is refused without both credentials and TLS,
//! unless the operator says they mean it ([`NatsSecurity::insecure`]).

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use async_nats::{ConnectErrorKind, ConnectOptions, ServerAddr};

use crate::config::ClusterConfig;
use crate::error::ClusterError;

/// One NATS server's URL as given: `nats://HOST:PORT` or `tls://HOST:PORT`,
/// perhaps with `USER:PASSWORD@` or `TOKEN@`. Its `Debug` and `Display` never
/// show the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct NatsUrl(String);

impl NatsUrl {
    /// The URL, parsed.
    fn parsed(&self) -> Result<ServerAddr, ClusterError> {
        ServerAddr::from_str(&self.0)
            .ok()
            .filter(|addr| matches!(addr.scheme(), "nats" | "tls") && !addr.host().is_empty())
            .ok_or_else(|| {
                ClusterError::Config(format!("`{self}` is not a NATS URL (nats://HOST:PORT)"))
            })
    }

    /// The URL without its user, password or token.
    fn without_secret(addr: &ServerAddr) -> String {
        let host = addr.host();
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.to_owned()
        };
        format!("{}://{host}:{}", addr.scheme(), addr.port())
    }

    /// Whether the server is on this machine.
    fn on_loopback(addr: &ServerAddr) -> bool {
        let host = addr.host();
        host.eq_ignore_ascii_case("localhost")
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    }
}

impl From<String> for NatsUrl {
    fn from(url: String) -> Self {
        NatsUrl(url)
    }
}

impl From<&str> for NatsUrl {
    fn from(url: &str) -> Self {
        NatsUrl(url.to_owned())
    }
}

impl std::fmt::Display for NatsUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.split_once("://") {
            Some((scheme, rest)) => match rest.rsplit_once('@') {
                Some((_, host)) => write!(f, "{scheme}://***@{host}"),
                None => f.write_str(&self.0),
            },
            None => f.write_str(self.0.split('@').next_back().unwrap_or_default()),
        }
    }
}

impl std::fmt::Debug for NatsUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "\"{self}\"")
    }
}

/// How a host proves itself to NATS and checks that it talks to NATS, beside
/// what its URLs carry. Paths only: the secrets stay in their files.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NatsSecurity {
    /// A `.creds` file (a user JWT and its NKey seed), as `nsc` writes it.
    pub credentials_file: Option<PathBuf>,
    /// A file holding an NKey user seed (`SU…`).
    pub nkey_file: Option<PathBuf>,
    /// The certificate authority (PEM) that signed the servers' certificates:
    /// TLS is required.
    pub ca_file: Option<PathBuf>,
    /// The host's own certificate and key (PEM), for servers that verify
    /// clients (mutual TLS): TLS is required.
    pub client_certificate: Option<(PathBuf, PathBuf)>,
    /// Join a bus off this machine without credentials or TLS anyway
    /// (`--insecure-cluster`): anyone who reaches it can read every event and
    /// send any agent any op.
    pub insecure: bool,
}

impl NatsSecurity {
    /// TLS checked against the authority `ca`, the host proving itself with
    /// the certificate `cert` and its `key` (mutual TLS).
    pub fn mutual_tls(ca: PathBuf, cert: PathBuf, key: PathBuf) -> Self {
        NatsSecurity {
            ca_file: Some(ca),
            client_certificate: Some((cert, key)),
            ..NatsSecurity::default()
        }
    }
}

/// What a configuration's URLs and files come to.
struct Plan {
    servers: Vec<String>,
    url_secret: Option<(String, Option<String>)>,
    tls: bool,
}

/// Reads the configuration's URLs, refusing bad ones, mixed secrets, more
/// than one kind of credential, and an open bus off this machine.
fn plan(config: &ClusterConfig) -> Result<Plan, ClusterError> {
    let refuse = |reason: String| Err(ClusterError::Config(reason));
    if config.servers.is_empty() {
        return refuse("no NATS server given: --cluster nats://HOST:PORT[,…]".to_owned());
    }
    let security = &config.security;
    let mut servers = Vec::with_capacity(config.servers.len());
    let mut url_secret: Option<(String, Option<String>)> = None;
    let (mut tls, mut off_machine) = (
        security.ca_file.is_some() || security.client_certificate.is_some(),
        None,
    );
    for url in &config.servers {
        let addr = url.parsed()?;
        let secret = addr
            .username()
            .map(|user| (decoded(user), addr.password().map(decoded)));
        match (&url_secret, secret) {
            (Some(known), Some(secret)) if *known != secret => {
                return refuse(
                    "the NATS URLs carry different credentials: give one user or token".to_owned(),
                );
            }
            (None, Some(secret)) => url_secret = Some(secret),
            _ => {}
        }
        tls |= addr.tls_required();
        if !NatsUrl::on_loopback(&addr) {
            off_machine.get_or_insert_with(|| addr.host().to_owned());
        }
        servers.push(NatsUrl::without_secret(&addr));
    }
    let kinds = [
        url_secret.is_some(),
        security.credentials_file.is_some(),
        security.nkey_file.is_some(),
    ];
    if kinds.iter().filter(|given| **given).count() > 1 {
        return refuse(
            "give one kind of NATS credential: a user or token in the URL, --nats-creds or --nats-nkey"
                .to_owned(),
        );
    }
    let credentials = kinds.contains(&true) || security.client_certificate.is_some();
    if let Some(host) = off_machine
        && !(credentials && tls)
        && !security.insecure
    {
        return refuse(format!(
            "the NATS server {host} is not on this machine and the bus would be open: give credentials \
             (USER:PASSWORD@ or TOKEN@ in the URL, --nats-creds, --nats-nkey or --nats-cert) and TLS \
             (tls://, --nats-ca), or --insecure-cluster to join it anyway"
        ));
    }
    Ok(Plan {
        servers,
        url_secret,
        tls,
    })
}

/// A URL's percent-encoded user, password or token as the server knows it
/// (`%40` is `@`).
fn decoded(text: &str) -> String {
    percent_encoding::percent_decode_str(text)
        .decode_utf8_lossy()
        .into_owned()
}

/// Refuses what [`connect`] would refuse, without connecting.
pub(crate) fn check(config: &ClusterConfig) -> Result<(), ClusterError> {
    plan(config).map(|_| ())
}

/// A file the configuration names, which must be there.
fn present<'a>(path: &'a Path, what: &str) -> Result<&'a Path, ClusterError> {
    if path.is_file() {
        Ok(path)
    } else {
        Err(ClusterError::Config(format!(
            "the {what} {} is not a readable file",
            path.display()
        )))
    }
}

/// Connects to the configuration's NATS servers with its credentials and TLS.
pub(crate) async fn connect(config: &ClusterConfig) -> Result<async_nats::Client, ClusterError> {
    let Plan {
        servers,
        url_secret,
        tls,
    } = plan(config)?;
    let security = &config.security;
    let mut options = ConnectOptions::new()
        .name(format!("tiller {}", config.host_id))
        .connection_timeout(Duration::from_secs(5));
    match url_secret {
        Some((user, Some(password))) => options = options.user_and_password(user, password),
        Some((token, None)) => options = options.token(token),
        None => {}
    }
    if let Some(path) = &security.credentials_file {
        let path = present(path, "NATS credentials file (--nats-creds)")?;
        options = options.credentials_file(path).await.map_err(|error| {
            ClusterError::Config(format!(
                "the NATS credentials file {} cannot be read: {error}",
                path.display()
            ))
        })?;
    }
    if let Some(path) = &security.nkey_file {
        let path = present(path, "NKey seed file (--nats-nkey)")?;
        let seed = std::fs::read_to_string(path)
            .ok()
            .and_then(|text| {
                text.lines()
                    .map(str::trim)
                    .find(|line| line.starts_with("SU"))
                    .map(str::to_owned)
            })
            .filter(|seed| nkeys::KeyPair::from_seed(seed).is_ok())
            .ok_or_else(|| {
                ClusterError::Config(format!(
                    "the file {} holds no NKey user seed (a line `SU…`)",
                    path.display()
                ))
            })?;
        options = options.nkey(seed);
    }
    if tls {
        options = options.require_tls(true);
    }
    if let Some(path) = &security.ca_file {
        let path = present(path, "certificate authority (--nats-ca)")?;
        options = options.add_root_certificates(path.to_owned());
    }
    if let Some((cert, key)) = &security.client_certificate {
        let cert = present(cert, "client certificate (--nats-cert)")?;
        let key = present(key, "client key (--nats-key)")?;
        options = options.add_client_certificate(cert.to_owned(), key.to_owned());
    }
    let shown = servers.join(",");
    options
        .connect(servers.as_slice())
        .await
        .map_err(|error| match error.kind() {
            ConnectErrorKind::AuthorizationViolation | ConnectErrorKind::Authentication => {
                ClusterError::Nats(format!(
                    "NATS at {shown} refused this host's credentials ({error})"
                ))
            }
            ConnectErrorKind::Tls => ClusterError::Nats(format!(
                "no TLS session with NATS at {shown}: {error} (is --nats-ca the authority that signed its certificate?)"
            )),
            _ => ClusterError::Nats(format!("cannot reach NATS at {shown}: {error}")),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(urls: &[&str]) -> ClusterConfig {
        ClusterConfig::new(urls.iter().map(|url| NatsUrl::from(*url)).collect(), "h1")
    }

    fn plan_of(urls: &[&str]) -> Plan {
        plan(&config(urls)).unwrap()
    }

    #[test]
    fn a_urls_secret_never_shows() {
        let url = NatsUrl::from("tls://tiller:s3cret@nats.example:4222");
        assert_eq!(url.to_string(), "tls://***@nats.example:4222");
        assert_eq!(format!("{url:?}"), "\"tls://***@nats.example:4222\"");
        let config = config(&["nats://t0ken@127.0.0.1:4222"]);
        assert!(!format!("{config:?}").contains("t0ken"));
        let plan = plan(&config).unwrap();
        assert_eq!(plan.servers, ["nats://127.0.0.1:4222"]);
        assert_eq!(plan.url_secret, Some(("t0ken".to_owned(), None)));
        let encoded = plan_of(&["tls://ti%3Aller:p%40ss%2Fword@127.0.0.1:4222"]);
        assert_eq!(
            encoded.url_secret,
            Some(("ti:ller".to_owned(), Some("p@ss/word".to_owned())))
        );
    }

    #[test]
    fn a_bus_off_this_machine_needs_credentials_and_tls() {
        let refused = |config: &ClusterConfig| matches!(check(config), Err(ClusterError::Config(reason)) if reason.contains("--insecure-cluster"));
        assert_eq!(
            check(&config(&["nats://127.0.0.1:4222", "nats://localhost:4223"])),
            Ok(())
        );
        assert!(refused(&config(&["nats://10.0.0.5:4222"])));
        assert!(refused(&config(&["nats://user:pass@10.0.0.5:4222"])));
        assert!(refused(&config(&["tls://10.0.0.5:4222"])));
        assert_eq!(check(&config(&["tls://user:pass@10.0.0.5:4222"])), Ok(()));
        let mut with_files = config(&["nats://nats.example:4222"]);
        with_files.security.nkey_file = Some("seed.nk".into());
        assert!(refused(&with_files));
        with_files.security.ca_file = Some("ca.pem".into());
        assert_eq!(check(&with_files), Ok(()));
        let mut insecure = config(&["nats://10.0.0.5:4222"]);
        insecure.security.insecure = true;
        assert_eq!(check(&insecure), Ok(()));
    }

    #[tokio::test]
    async fn a_credentials_or_seed_file_that_cannot_be_used_is_refused_before_connecting() {
        let refused = |security: NatsSecurity| async move {
            let mut config = config(&["nats://127.0.0.1:9"]);
            config.security = security;
            match connect(&config).await {
                Err(ClusterError::Config(reason)) => reason,
                other => panic!("{other:?}"),
            }
        };
        let missing = refused(NatsSecurity {
            credentials_file: Some("/nonexistent/tiller.creds".into()),
            ..NatsSecurity::default()
        })
        .await;
        assert!(missing.contains("--nats-creds"), "{missing}");
        let folder = std::env::temp_dir().join(format!("tiller-creds-{}", std::process::id()));
        std::fs::create_dir_all(&folder).unwrap();
        let garbage = folder.join("garbage.creds");
        std::fs::write(&garbage, "not a credentials file").unwrap();
        let unreadable = refused(NatsSecurity {
            credentials_file: Some(garbage),
            ..NatsSecurity::default()
        })
        .await;
        assert!(unreadable.contains("cannot be read"), "{unreadable}");
        let no_seed = folder.join("seed.nk");
        std::fs::write(&no_seed, "SUNOTASEED").unwrap();
        let seedless = refused(NatsSecurity {
            nkey_file: Some(no_seed),
            ..NatsSecurity::default()
        })
        .await;
        assert!(seedless.contains("no NKey user seed"), "{seedless}");
        let _ = std::fs::remove_dir_all(&folder);
    }

    #[test]
    fn one_kind_of_credential_and_one_secret() {
        let mut both = config(&["tls://u:p@10.0.0.5:4222"]);
        both.security.credentials_file = Some("x.creds".into());
        assert!(matches!(check(&both), Err(ClusterError::Config(_))));
        let mixed = config(&["tls://u:p@10.0.0.5:4222", "tls://v:q@10.0.0.6:4222"]);
        assert!(matches!(check(&mixed), Err(ClusterError::Config(_))));
        assert!(matches!(
            check(&config(&["http://127.0.0.1:4222"])),
            Err(ClusterError::Config(_))
        ));
    }
}
