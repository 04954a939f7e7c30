//! `tiller serve --cluster`: this host's part in a cluster of `tiller serve`s
//! (the `tiller-cluster` crate), over NATS and PostgreSQL. It is built with the crate's
//! `cluster` feature (`cargo install --path crates/tiller-cli --features
//! cluster`); a `tiller` built without it refuses `--cluster` and says so.

use std::path::Path;
use std::time::Duration;

use tiller::{Definitions, Supervisor};
use tiller_server::{Server, ServerConfig};

use crate::cli::ClusterUrls;
use crate::outcome::Exit;

/// What `tiller serve --cluster` was given.
#[derive(Debug)]
pub struct ClusterOptions<'a> {
    /// The NATS servers, separated by commas (never shown with a secret).
    pub servers: &'a ClusterUrls,
    /// Whether `servers` came from the command line (where `ps` shows it), not
    /// from `$TILLER_CLUSTER`: a secret in it is refused.
    pub servers_on_command_line: bool,
    /// The host's NATS credentials and TLS files.
    pub security: NatsFiles<'a>,
    /// This host's id (a new one when `None`).
    pub host_id: Option<&'a str>,
    /// Whether shutdown moves the agents away first.
    pub drain: bool,
    /// The lease TTL every host of the cluster shares.
    pub lease_ttl: Duration,
    /// How long an agent stays idle before its lease is marked idle.
    pub idle_after: Duration,
}

/// The files a host proves itself to the NATS servers with, as given.
#[derive(Debug, Clone, Copy, Default)]
pub struct NatsFiles<'a> {
    /// A credentials file (a user JWT and its NKey seed).
    pub credentials_file: Option<&'a Path>,
    /// A file holding an NKey user seed.
    pub nkey_file: Option<&'a Path>,
    /// The certificate authority of the servers' certificates.
    pub ca_file: Option<&'a Path>,
    /// A client certificate and its key, for mutual TLS.
    pub client_certificate: Option<(&'a Path, &'a Path)>,
    /// Whether a bus off this machine is joined without credentials or TLS.
    pub insecure: bool,
}

/// A checked cluster configuration (none can be made without the feature).
#[cfg(feature = "cluster")]
pub(crate) type Cluster = tiller_cluster::ClusterConfig;
/// A checked cluster configuration (none can be made without the feature).
#[cfg(not(feature = "cluster"))]
pub(crate) enum Cluster {}

/// The cluster's configuration, checked: its URLs carry no secret on the
/// command line, and its sessions are in PostgreSQL.
#[cfg(feature = "cluster")]
pub(crate) fn config(
    cluster: Option<ClusterOptions<'_>>,
    store: Option<&str>,
) -> Result<Option<Cluster>, Exit> {
    use tiller_cluster::{ClusterConfig, NatsSecurity};

    let Some(cluster) = cluster else {
        return Ok(None);
    };
    if cluster.servers_on_command_line && cluster.servers.0.contains('@') {
        return Err(Exit::usage(
            "--cluster carries a secret where `ps` shows it: put the URLs in $TILLER_CLUSTER, or give --nats-creds or --nats-nkey",
        ));
    }
    let host_id = cluster.host_id.map_or_else(
        || format!("host-{}", &tiller::ai::new_id()[24..]),
        str::to_owned,
    );
    let mut config = ClusterConfig::new(ClusterConfig::servers_from(&cluster.servers.0), host_id);
    let files = cluster.security;
    config.security = NatsSecurity {
        credentials_file: files.credentials_file.map(Path::to_path_buf),
        nkey_file: files.nkey_file.map(Path::to_path_buf),
        ca_file: files.ca_file.map(Path::to_path_buf),
        client_certificate: files
            .client_certificate
            .map(|(cert, key)| (cert.to_path_buf(), key.to_path_buf())),
        insecure: files.insecure,
    };
    config.lease_ttl = cluster.lease_ttl;
    config.idle_after = cluster.idle_after;
    // The margin and the renewal scale down with a short TTL (tests), never
    // below what NATS counts in.
    config.fence_margin = (cluster.lease_ttl / 5).max(Duration::from_secs(1));
    config.renew_every = (config.fence_after() / 4).min(Duration::from_secs(1));
    config.check().map_err(Exit::usage)?;
    if !store.is_some_and(|url| url.starts_with("postgres")) {
        return Err(Exit::usage(
            "--cluster needs --store postgres://…: every host of a cluster keeps its sessions in one PostgreSQL",
        ));
    }
    Ok(Some(config))
}

/// `--cluster` refused: this `tiller` was built without the cluster.
#[cfg(not(feature = "cluster"))]
pub(crate) fn config(
    cluster: Option<ClusterOptions<'_>>,
    _store: Option<&str>,
) -> Result<Option<Cluster>, Exit> {
    match cluster {
        None => Ok(None),
        Some(_) => Err(Exit::usage(
            "this tiller was built without the cluster: build it with `--features cluster` (cargo install --path crates/tiller-cli --features cluster)",
        )),
    }
}

/// The clustered server once its host joined; the port answers 503 `joining`
/// (healthz too) until then.
#[cfg(feature = "cluster")]
pub(crate) async fn join(
    listener: &tokio::net::TcpListener,
    address: &str,
    supervisor: Supervisor,
    definitions: Definitions,
    config: ServerConfig,
    cluster: Cluster,
) -> Result<Server, Exit> {
    let host = cluster.host_id.clone();
    let joining = Server::clustered(supervisor, definitions, config, cluster);
    let joined = tiller_server::while_joining(listener, joining)
        .await
        .map_err(|error| {
            Exit::failed(format!("cannot listen on {address} while joining: {error}"))
        })?;
    match joined {
        Ok(server) => {
            crate::say!("tiller: host {host} joined the cluster");
            Ok(server)
        }
        Err(error @ tiller_cluster::ClusterError::Config(_)) => Err(Exit::usage(error)),
        Err(error) => Err(Exit::failed(error)),
    }
}

/// No cluster to join without the feature.
#[cfg(not(feature = "cluster"))]
pub(crate) async fn join(
    _listener: &tokio::net::TcpListener,
    _address: &str,
    _supervisor: Supervisor,
    _definitions: Definitions,
    _config: ServerConfig,
    cluster: Cluster,
) -> Result<Server, Exit> {
    match cluster {}
}
