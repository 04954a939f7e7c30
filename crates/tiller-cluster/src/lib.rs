//! Tiller hosts as a cluster on NATS JetStream and PostgreSQL.
//!
//! Each host runs its own [`Supervisor`] on the one PostgreSQL store of record;
//! NATS decides which host owns which agent, carries the agents' [`Op`]s to their
//! owners and their events to every host. No consensus of Tiller's own:
//!
//! - **Placement with fencing.** An agent's owner is the host whose lease on it
//!   (a key of the `tiller_leases` KV bucket, replicated) was written last by
//!   compare-and-set; the write's revision is the owner's **epoch**, which every
//!   store write of the agent carries, and the store refuses an older one. A
//!   host's leases live as long as its heartbeat (`tiller_hosts`, whose entries
//!   expire after the lease TTL): renewal is one write per host, not per agent,
//!   and a host that has not renewed within `TTL − margin` of its last
//!   successful renewal fences itself (its agents stop, writing nothing more).
//! - **Routing.** The owner answers requests on the agent's own subject; any host
//!   forwards to it. "No responders" means no one holds the agent: the request
//!   asks the host rendezvous hashing prefers to bring it up, and is sent again.
//!   Every op carries an idempotency key: a retry is never applied twice.
//! - **Events from any host.** The owner's host sends its agents' events live,
//!   many agents to one message on its bus (core NATS), which every host reads;
//!   and durably, to the `TILLER_EVENTS` stream in batches, each conditional on
//!   the last one (`Nats-Expected-Last-Subject-Sequence`), so a replaced owner
//!   cannot add to the stream once its successor has said `owner_changed`. A
//!   follower on any host reads live and fills gaps from the stream, and
//!   `Last-Event-ID` resumes anywhere.
//! - **Failover and drain.** When a host's heartbeat expires, the live hosts take
//!   over its busy agents (a run, or queued input) at once — the turn in progress
//!   is run again, after `turn_restarted` — and the idle ones on their next
//!   request. [`Cluster::drain`] moves a host's agents away between turns.
//!
//! `docs/cluster.md` has the deployment, the timings and what is exactly-once.
//!
//! ```no_run
//! use std::sync::Arc;
//! use tiller::{AgentSettings, AgentSpec, Op, Supervisor, store::SessionRecord};
//! use tiller_cluster::{Activator, Cluster, ClusterConfig};
//!
//! /// Brings any agent up on the faux model (a real host rebuilds it from the
//! /// session's origin).
//! struct Faux;
//! impl Activator for Faux {
//!     fn spec(&self, _session: &SessionRecord) -> Result<AgentSpec, String> {
//!         Ok(AgentSpec::new(AgentSettings::new(tiller::faux::demo_model())))
//!     }
//! }
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let store = tiller::store::open("postgres://tiller@127.0.0.1:5432/tiller").await?;
//! let supervisor = Supervisor::with_store(Default::default(), store).await?;
//! let config = ClusterConfig::new(vec!["nats://127.0.0.1:4222".into()], "host-1");
//! let cluster = Cluster::join(config, supervisor, Arc::new(Faux)).await?;
//! let agent = cluster.spawn(AgentSpec::new(AgentSettings::new(tiller::faux::demo_model()))).await?;
//! // From this host or any other:
//! cluster
//!     .submit(agent.id().as_str(), Op::from(tiller::Prompt::from("Hi")), "request-1")
//!     .await?;
//! # Ok(())
//! # }
//! ```

mod activate;
mod audit;
mod config;
mod connect;
mod drain;
mod error;
mod failover;
mod follow;
mod membership;
mod metrics;
mod names;
mod owned;
mod publish;
mod route;
mod view;
mod wire;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_nats::jetstream::{self, kv, stream};
use dashmap::DashMap;
use tiller_runtime::{AgentHandle, AgentSpec, AgentState, AgentStatus, Op, RunOutcome, Supervisor};
use tiller_store::SessionRecord;
use tokio_util::task::AbortOnDropHandle;

pub use audit::{PublishedBatch, published};
pub use config::{ClusterConfig, MAX_HOST_ID_BYTES};
pub use connect::{NatsSecurity, NatsUrl};
pub use drain::Drained;
pub use error::ClusterError;
pub use follow::{Followed, Following};
pub use metrics::ClusterMetrics;
pub use names::{EventSubject, op_subject};
pub use wire::{Holder, Principal, Request, Response};

use membership::Life;
use metrics::Counters;
use owned::Owned;
use view::View;

/// How a host brings up an agent it did not create: the spec for its session,
/// from what the session keeps ([`SessionRecord::origin`]: for `tiller serve`,
/// the definition it was made from). The cluster sets the id, session, epoch and
/// first event number itself.
pub trait Activator: Send + Sync + 'static {
    /// The spec to bring `session`'s agent up with, or why it cannot be.
    fn spec(&self, session: &SessionRecord) -> Result<AgentSpec, String>;

    /// Whether the owner carries out `op`, sent over the bus for `on_behalf`
    /// by another host, on `agent` (its own host's ops were checked where they
    /// were taken): a guard against a host's bugs and against ops no client
    /// could send. Every op, by default.
    fn admit(&self, _agent: &AgentHandle, _op: &Op, _on_behalf: &Principal) -> Result<(), String> {
        Ok(())
    }

    /// Told once an agent is held here — spawned, taken over or moved here —
    /// for the host to follow it as its own (record its events, count its runs).
    fn held(&self, _agent: &AgentHandle) {}
}

/// This host's part in a cluster. Cheap to clone; clones share it.
#[derive(Clone)]
pub struct Cluster {
    inner: Arc<Inner>,
}

/// What the cluster's tasks share.
pub(crate) struct Inner {
    pub(crate) config: ClusterConfig,
    pub(crate) client: async_nats::Client,
    pub(crate) js: jetstream::Context,
    pub(crate) leases: kv::Store,
    pub(crate) hosts: kv::Store,
    pub(crate) events: stream::Stream<()>,
    pub(crate) supervisor: Supervisor,
    pub(crate) activator: Arc<dyn Activator>,
    /// The agents this host owns.
    pub(crate) owned: DashMap<String, Arc<Owned>>,
    /// One activation at a time per agent on this host.
    pub(crate) activating: DashMap<String, Arc<tokio::sync::Mutex<()>>>,
    /// The hosts and leases as the buckets' watchers last saw them.
    pub(crate) view: View,
    /// This host's heartbeat: its life, and when it last renewed.
    pub(crate) life: Life,
    pub(crate) counters: Counters,
    /// Set once the host leaves (a drain, a shutdown): it takes no agent.
    pub(crate) leaving: AtomicBool,
    /// Publishes the owned agents' events.
    pub(crate) publisher: publish::Publisher,
    /// Hands what the buses carry to this host's followers.
    pub(crate) listeners: follow::Listeners,
    /// The host's own tasks (heartbeat, watchers, activations), stopped with it.
    tasks: std::sync::Mutex<Vec<AbortOnDropHandle<()>>>,
}

impl Inner {
    /// This host's id.
    pub(crate) fn me(&self) -> &str {
        &self.config.host_id
    }

    /// Paces the providers' accounts as one of the live hosts: each keeps to
    /// its part of every account's limits.
    pub(crate) fn share_limits(&self) {
        if let Some(limits) = self.supervisor.rate_limits() {
            limits.set_sharers(u32::try_from(self.view.live()).unwrap_or(u32::MAX));
        }
    }

    /// Keeps `task` running until the host leaves.
    pub(crate) fn keep(&self, task: tokio::task::JoinHandle<()>) {
        self.tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(AbortOnDropHandle::new(task));
    }
}

/// Sleeps until `at`; forever, when there is none (a `select!` branch with no
/// deadline set).
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The last message on `subject` of `stream`; `None` when it has none.
async fn last_message<I>(
    stream: &stream::Stream<I>,
    subject: &str,
) -> Result<Option<async_nats::jetstream::message::StreamMessage>, stream::LastRawMessageError> {
    match stream.get_last_raw_message_by_subject(subject).await {
        Ok(message) => Ok(Some(message)),
        Err(error) if error.kind() == stream::LastRawMessageErrorKind::NoMessageFound => Ok(None),
        Err(error) => Err(error),
    }
}

/// How long joining first waits for each answer while it makes the buckets
/// and the stream before it asks again (a create answers in about 0.5 s on a
/// fresh cluster; the wait doubles with each try, up to 5 s, for slow links).
const SETUP_ANSWER_WITHIN: Duration = Duration::from_millis(500);

/// `attempt` until it succeeds, for up to 30 seconds (a cluster just started,
/// or electing): each try given `within` (doubling, up to 5 s), if anything,
/// and `between` apart.
async fn until_ready<T, E: std::fmt::Display, F: Future<Output = Result<T, E>>>(
    mut attempt: impl FnMut() -> F,
    mut within: Option<Duration>,
    between: Duration,
) -> Result<T, ClusterError> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let trouble = match within {
            Some(wait) => match tokio::time::timeout(wait, attempt()).await {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(error)) => error.to_string(),
                Err(_) => format!("no answer within {wait:?}"),
            },
            None => match attempt().await {
                Ok(value) => return Ok(value),
                Err(error) => error.to_string(),
            },
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(ClusterError::Nats(trouble));
        }
        tracing::debug!(%trouble, "JetStream not ready; retrying");
        within = within.map(|wait| (wait * 2).min(Duration::from_secs(5)));
        tokio::time::sleep(between).await;
    }
}

/// Retries `attempt` while JetStream answers that it has no leader yet (a
/// cluster just started, or electing), for up to 30 seconds.
async fn while_electing<T, E: std::fmt::Display, F: Future<Output = Result<T, E>>>(
    attempt: impl FnMut() -> F,
) -> Result<T, ClusterError> {
    until_ready(attempt, None, Duration::from_millis(250)).await
}

/// Makes a bucket or the stream: [`until_ready`], each try given a while.
async fn setting_up<T, E: std::fmt::Display, F: Future<Output = Result<T, E>>>(
    attempt: impl FnMut() -> F,
) -> Result<T, ClusterError> {
    until_ready(
        attempt,
        Some(SETUP_ANSWER_WITHIN),
        Duration::from_millis(50),
    )
    .await
}

impl Cluster {
    /// Joins the cluster as `config.host_id`: connects to NATS, makes the
    /// buckets and the stream if this is the first host, starts the heartbeat and
    /// the watchers, and takes over busy agents that lost their host while no
    /// host watched. `supervisor` runs the agents this host owns; its store must
    /// be the cluster's shared one (PostgreSQL).
    pub async fn join(
        config: ClusterConfig,
        supervisor: Supervisor,
        activator: Arc<dyn Activator>,
    ) -> Result<Cluster, ClusterError> {
        config.check()?;
        let client = connect::connect(&config).await?;
        let js = jetstream::new(client.clone());
        // The buckets and the stream, made (or found) at once. Hosts started
        // together race to make them, and JetStream may leave a losing create
        // unanswered: each try is given up after a short wait and made again
        // (then finding the winner's), where the client's own timeout would
        // cost 5 s a loss.
        let hosts_config = kv::Config {
            bucket: names::HOSTS.to_owned(),
            description: "Tiller hosts' heartbeats".to_owned(),
            history: 1,
            max_age: config.lease_ttl,
            num_replicas: config.replicas,
            // A heartbeat that expires leaves a marker watchers see.
            limit_markers: Some(Duration::from_secs(1)),
            ..kv::Config::default()
        };
        let leases_config = kv::Config {
            bucket: names::LEASES.to_owned(),
            description: "Tiller agents' owners".to_owned(),
            history: 1,
            num_replicas: config.replicas,
            // Released leases leave markers that expire.
            limit_markers: Some(Duration::from_secs(60)),
            ..kv::Config::default()
        };
        let events_config = stream::Config {
            name: names::EVENTS.to_owned(),
            description: Some("Tiller agents' events".to_owned()),
            subjects: vec![names::EVENT_SUBJECTS.to_owned()],
            num_replicas: config.replicas,
            max_messages_per_subject: config.event_batches_kept,
            max_age: config.event_retention,
            duplicate_window: Duration::from_secs(120),
            max_consumers: -1,
            allow_direct: true,
            ..stream::Config::default()
        };
        let (hosts, leases, _) = tokio::try_join!(
            setting_up(|| js.create_or_update_key_value(hosts_config.clone())),
            setting_up(|| js.create_or_update_key_value(leases_config.clone())),
            setting_up(|| js.create_or_update_stream(events_config.clone())),
        )?;
        let events = js
            .get_stream_no_info(names::EVENTS)
            .await
            .map_err(ClusterError::nats)?;
        let ttl = while_electing(|| hosts.status()).await?.max_age();
        if ttl != config.lease_ttl {
            return Err(ClusterError::Config(format!(
                "the cluster's lease TTL is {ttl:?}; this host was given {:?}",
                config.lease_ttl
            )));
        }
        let inner = Arc::new_cyclic(|weak| {
            let (publisher, publishing) =
                publish::Publisher::start(weak.clone(), config.live_interval);
            Inner {
                life: Life::new(),
                config,
                client,
                js,
                leases,
                hosts,
                events,
                supervisor,
                activator,
                owned: DashMap::new(),
                activating: DashMap::new(),
                view: View::default(),
                counters: Counters::default(),
                leaving: AtomicBool::new(false),
                publisher,
                listeners: follow::Listeners::default(),
                tasks: std::sync::Mutex::new(vec![AbortOnDropHandle::new(publishing)]),
            }
        });
        // Hosts started with the NATS cluster meet its first elections here too.
        while_electing(|| membership::register(&inner)).await?;
        follow::listen(&inner).await?;
        while_electing(|| view::watch(&inner)).await?;
        activate::serve(&inner).await?;
        membership::start(&inner);
        failover::start(&inner);
        Ok(Cluster { inner })
    }

    /// This host's id.
    pub fn host_id(&self) -> &str {
        self.inner.me()
    }

    /// The supervisor running this host's agents.
    pub fn supervisor(&self) -> &Supervisor {
        &self.inner.supervisor
    }

    /// Spawns a new agent on this host, under a new lease (a spec without an id
    /// gets a time-ordered one): the session is created (or, with
    /// [`AgentSpec::with_session`], resumed) at the lease's epoch.
    pub async fn spawn(&self, spec: AgentSpec) -> Result<AgentHandle, ClusterError> {
        activate::spawn(&self.inner, spec).await
    }

    /// Carries out `op` on `agent`, wherever it lives (bringing it up if no host
    /// holds it), and returns once it is durable. `key` is the op's idempotency
    /// key: a retry with the same key is never applied twice.
    pub async fn submit(&self, agent: &str, op: Op, key: &str) -> Result<(), ClusterError> {
        self.submit_as(agent, op, key, Principal::default()).await
    }

    /// [`Cluster::submit`] for `on_behalf`, whom this host authorised the op
    /// for: the owner checks it ([`Activator::admit`]).
    pub async fn submit_as(
        &self,
        agent: &str,
        op: Op,
        key: &str,
        on_behalf: Principal,
    ) -> Result<(), ClusterError> {
        self.inner
            .request(
                agent,
                Request::Submit {
                    op,
                    key: key.to_owned(),
                    on_behalf,
                },
            )
            .await
            .map(|_| ())
    }

    /// Carries out `op`, one that starts a run, and waits for the run to end,
    /// wherever the agent lives and however often its owner changes meanwhile
    /// (the outcome is the last run's, after a failover re-runs a turn). `subject`
    /// says where its events go.
    pub async fn run(
        &self,
        subject: &EventSubject,
        op: Op,
        key: &str,
    ) -> Result<RunOutcome, ClusterError> {
        self.run_as(subject, op, key, Principal::default()).await
    }

    /// [`Cluster::run`] for `on_behalf`, whom this host authorised the op for.
    pub async fn run_as(
        &self,
        subject: &EventSubject,
        op: Op,
        key: &str,
        on_behalf: Principal,
    ) -> Result<RunOutcome, ClusterError> {
        route::run(&self.inner, subject, op, key, on_behalf).await
    }

    /// The agent's state, from its owner, and who that is.
    pub async fn state(&self, agent: &str) -> Result<(AgentState, Holder), ClusterError> {
        match self.inner.request(agent, Request::State).await? {
            Response::State { state, holder } => Ok((*state, holder)),
            other => Err(ClusterError::Nats(format!(
                "the owner answered a state request with {other:?}"
            ))),
        }
    }

    /// Stops `agent` for good wherever it lives (its session closed, its lease
    /// given up); whether a host held it.
    pub async fn stop(&self, agent: &str) -> Result<bool, ClusterError> {
        route::stop(&self.inner, agent).await
    }

    /// `agent`'s events as they are published, from any host: after `after` (a
    /// client's `Last-Event-ID`, replayed from the stream), else from now on.
    pub async fn follow(
        &self,
        subject: &EventSubject,
        after: Option<u64>,
    ) -> Result<Following, ClusterError> {
        follow::follow(&self.inner, subject, after).await
    }

    /// Every event of `tenant`'s agents (of `user`'s, when given; of every agent
    /// with neither) from now on.
    pub fn follow_all(&self, tenant: Option<&str>, user: Option<&str>) -> Following {
        follow::follow_all(&self.inner, tenant, user)
    }

    /// The agent, when this host owns it.
    pub fn local(&self, agent: &str) -> Option<AgentHandle> {
        self.inner
            .owned
            .get(agent)
            .map(|owned| owned.handle.clone())
    }

    /// The agents the cluster's leases name, with their owners and whether they
    /// are busy, sorted by id.
    pub fn leased(&self) -> Vec<Leased> {
        self.inner.view.leased()
    }

    /// The status of each of `agents` (those the leases name), asked of their
    /// owners in one request per host: an agent no live host holds, or whose
    /// owner does not answer in time, is `Hibernated`.
    pub async fn statuses(&self, agents: &[String]) -> HashMap<String, AgentStatus> {
        let inner = &self.inner;
        let mut by_host: HashMap<String, Vec<String>> = HashMap::new();
        for agent in agents {
            if let Some(host) = inner.view.owner_of(agent) {
                by_host.entry(host).or_default().push(agent.clone());
            }
        }
        let mut statuses: HashMap<String, AgentStatus> = agents
            .iter()
            .map(|agent| (agent.clone(), AgentStatus::Hibernated))
            .collect();
        let asked = by_host.into_iter().map(|(host, agents)| async move {
            if host == inner.me() {
                return statuses_here(inner, &agents);
            }
            let request =
                serde_json::to_vec(&wire::HostRequest::Statuses { agents }).unwrap_or_default();
            let request = async_nats::Request::new()
                .payload(request.into())
                .timeout(Some(Duration::from_secs(2)));
            match inner
                .client
                .send_request(names::host_subject(&host), request)
                .await
            {
                Ok(answer) => serde_json::from_slice(&answer.payload).unwrap_or_default(),
                Err(_) => Vec::new(),
            }
        });
        for answered in futures::future::join_all(asked).await {
            statuses.extend(answered);
        }
        statuses
    }

    /// The owner of `agent` when it has work (a run, queued messages) and its
    /// host lives, as the lease view has it: where a message may be streaming.
    pub fn working_owner(&self, agent: &str) -> Option<String> {
        self.inner.view.working_owner(agent)
    }

    /// The owner of `agent`, as the lease view has it.
    pub fn owner_of(&self, agent: &str) -> Option<String> {
        self.inner.view.owner_of(agent)
    }

    /// Moves this host's agents to the other hosts, each between two turns, and
    /// takes no new ones: for a host about to stop.
    pub async fn drain(&self) -> Drained {
        drain::drain(&self.inner).await
    }

    /// Leaves the cluster: takes no new agent, stops answering, stops this
    /// host's agents without a word (their leases lapse with the heartbeat, and
    /// the other hosts take the busy ones over), and stops the host's tasks.
    /// After [`Cluster::drain`], nothing is left to stop.
    pub async fn leave(&self) {
        let inner = &self.inner;
        inner.leaving.store(true, Ordering::Release);
        owned::evict_all(inner, "the host left the cluster");
        let _ = inner.hosts.delete(names::token(inner.me())).await;
        inner
            .tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clear();
        let _ = inner.client.flush().await;
    }

    /// The figures `/metrics` shows.
    pub fn metrics(&self) -> ClusterMetrics {
        metrics::snapshot(&self.inner)
    }
}

/// The status of each of `agents` this host owns.
pub(crate) fn statuses_here(inner: &Inner, agents: &[String]) -> Vec<(String, AgentStatus)> {
    agents
        .iter()
        .filter_map(|agent| {
            let owned = inner.owned.get(agent)?;
            Some((agent.clone(), owned.handle.status()))
        })
        .collect()
}

/// An agent as the cluster's leases name it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Leased {
    /// The agent.
    pub id: String,
    /// The host that owns it.
    pub host: String,
    /// Whether it has work left (a run, queued messages).
    pub busy: bool,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("host", &self.inner.me())
            .field("owned", &self.inner.owned.len())
            .finish()
    }
}
