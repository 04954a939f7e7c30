//! Agents started by events: an agent file's `triggers` name the topics it
//! answers, and [`Triggers`] turns each published [`Event`] that matches one
//! into a prompt to the agent of the session the trigger names — spawned from
//! its definition, or thawed, when it is not running.
//!
//! ```yaml
//! json_schema_extra:
//!   kind: agent
//!   name: support
//!   triggers:
//!     - on: ticket.opened            # the topic
//!       match: {priority: high}      # fields of the payload (dotted paths), all equal
//!       debounce_ms: 2000            # events within 2 s become one prompt
//!       session: "ticket-{ticket.id}" # one session per ticket
//! ```
//!
//! The first matching event of a session opens a window of `debounce_ms`; every
//! event that arrives for that session within it joins the same prompt, which
//! lists each payload in order ([`MAX_BATCH`] at most: a full batch goes at
//! once). A trigger without `session` has one session for all its events. A
//! session belongs to the event's tenant, and to its user when a user's token
//! sent it: the same key of two tenants (or users) is two agents, each its own.
//! An agent busy with a run gets the prompt as a follow-up.
//!
//! Publishing is checked before anything is taken: a session key that cannot
//! name a session (empty, past [`MAX_ID_BYTES`](tiller_runtime::MAX_ID_BYTES),
//! control characters) is [`EventError::Key`]; a tenant past its quota of open
//! windows, or of the bytes of payloads waiting in them ([`WindowQuota`]), is
//! [`EventError::Quota`].

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tiller_runtime::{AgentError, Event, EventError, EventSink, Op};
use tokio::sync::mpsc;

use crate::definitions::Definitions;
use crate::{AgentHandle, AgentSpec, Supervisor};

/// The longest debounce window a trigger may ask for, in milliseconds (an hour).
pub const MAX_DEBOUNCE_MS: u64 = 3_600_000;

/// The most events one prompt lists; a window that fills is delivered at once.
pub const MAX_BATCH: usize = 100;

/// The most events waiting for the trigger task at once; past it, publishing
/// is refused ([`EventError::Closed`] is not it: see [`Triggers`]).
const QUEUE: usize = 10_000;

/// The most windows a tenant holds open at once by default.
pub const DEFAULT_WINDOWS: usize = 1_000;

/// The most bytes of payloads waiting in a tenant's windows by default.
pub const DEFAULT_WINDOW_BYTES: usize = 16 << 20;

/// Each tenant's quota of open windows (`windows`), of the bytes waiting in
/// them (`bytes`) and of the windows that will start an agent (`agents`: those
/// of sessions no live agent holds), by tenant (`None`: events of no tenant),
/// asked at each publication. A window counts until its batch is delivered
/// (its agent live), so a host can hold `agents` to the agents a tenant may
/// still start.
pub type WindowQuota = Arc<dyn Fn(Option<&str>) -> WindowLimits + Send + Sync>;

/// A tenant's bounds on its trigger windows (see [`WindowQuota`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowLimits {
    /// Windows open at once.
    pub windows: usize,
    /// Bytes of payloads waiting in them.
    pub bytes: usize,
    /// Windows open at once that will start an agent.
    pub agents: usize,
}

impl Default for WindowLimits {
    fn default() -> Self {
        WindowLimits {
            windows: DEFAULT_WINDOWS,
            bytes: DEFAULT_WINDOW_BYTES,
            agents: usize::MAX,
        }
    }
}

/// One trigger of an agent file (see the module docs): an event's topic it
/// answers (`on`), or a schedule it fires on (`every`, `cron`; see
/// [`crate::schedule`]), whose fires are the topic `schedule.NAME.N`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Trigger {
    /// The topic it answers (a scheduled trigger's is set when its file is read).
    #[serde(default)]
    pub on: String,
    /// Fires every so long (`15m`; see [`crate::schedule`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every: Option<String>,
    /// Fires at a cron expression's times, in `timezone`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    /// The IANA time zone `cron` is read in (UTC when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// Fields of the payload, by dotted path, and the values they must equal.
    #[serde(default, rename = "match", skip_serializing_if = "BTreeMap::is_empty")]
    pub matches: BTreeMap<String, Value>,
    /// How long events gather into one prompt, in milliseconds (0: none).
    #[serde(default)]
    pub debounce_ms: u64,
    /// The session's key, with `{path}` for fields of the payload; one session
    /// for every event when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
}

impl Trigger {
    /// Whether `event`'s topic is this trigger's and its payload has every
    /// field `match` names, equal.
    pub fn matches(&self, event: &Event) -> bool {
        event.topic == self.on
            && self
                .matches
                .iter()
                .all(|(path, value)| field(&event.payload, path) == Some(value))
    }

    /// The session key `payload` gives: `session` with each `{path}` replaced
    /// by that field (a string as it is, anything else as JSON); `None` when a
    /// field is missing.
    pub fn session_key(&self, payload: &Value) -> Option<String> {
        let Some(template) = &self.session else {
            return Some(String::new());
        };
        let mut key = String::new();
        let mut rest = template.as_str();
        while let Some(open) = rest.find('{') {
            key.push_str(&rest[..open]);
            let close = rest[open..].find('}')? + open;
            match field(payload, &rest[open + 1..close])? {
                Value::String(text) => key.push_str(text),
                other => key.push_str(&other.to_string()),
            }
            rest = &rest[close + 1..];
        }
        key.push_str(rest);
        Some(key)
    }

    /// Checks what loading cannot: a topic, closed braces, a bounded window.
    pub(crate) fn check(&self) -> Result<(), (&'static str, String)> {
        crate::schedule::Schedule::of(self)?;
        Event::new(self.on.clone(), Value::Null)
            .check()
            .map_err(|error| ("on", error.to_string()))?;
        if self.debounce_ms > MAX_DEBOUNCE_MS {
            return Err((
                "debounce_ms",
                format!("at most {MAX_DEBOUNCE_MS} (an hour)"),
            ));
        }
        if let Some(template) = &self.session {
            let mut depth = 0usize;
            for c in template.chars() {
                match c {
                    '{' if depth == 0 => depth = 1,
                    '}' if depth == 1 => depth = 0,
                    '{' | '}' => depth = 2,
                    _ => {}
                }
            }
            if depth != 0 || template.contains("{}") {
                return Err((
                    "session",
                    "each `{` names a field and is closed by `}`".into(),
                ));
            }
        }
        Ok(())
    }
}

/// The field at a dotted `path` of `value` (`order.id`; an array's items by
/// their index).
fn field<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(value, |at, part| match at {
        Value::Object(map) => map.get(part),
        Value::Array(items) => items.get(part.parse::<usize>().ok()?),
        _ => None,
    })
}

/// Makes the agent of a session a trigger starts, when this process holds no
/// agent for it. By default the supervisor spawns it; a server passes its own,
/// to record whom the agent belongs to, and — a host of a cluster — to hand the
/// prompt to the host that holds the session.
pub type Spawner =
    Arc<dyn Fn(Arrival) -> BoxFuture<'static, Result<Spawned, String>> + Send + Sync>;

/// What a [`Spawner`] is given: the agent to start for a batch of events, and
/// the batch's prompt.
#[derive(Debug)]
pub struct Arrival {
    /// The agent's spec: its id, session and owner set.
    pub spec: AgentSpec,
    /// The definition it is made from.
    pub definition: String,
    /// The events' tenant.
    pub tenant: Option<String>,
    /// The prompt the batch makes.
    pub prompt: String,
}

/// What a [`Spawner`] did with an [`Arrival`].
#[derive(Debug)]
pub enum Spawned {
    /// The agent runs here: it is prompted with the batch.
    Here(AgentHandle),
    /// Another process holds the session's agent and has taken the prompt
    /// (durably, once).
    Delivered,
}

/// The triggers of a set of definitions, attached to a supervisor (see the
/// module docs). Events go through a bounded queue to one task that owns the
/// debounce windows; dropping every `Triggers` (and the supervisor's sink) ends
/// it.
#[derive(Clone)]
pub struct Triggers {
    /// Each trigger and the definition it starts.
    triggers: Arc<[(String, Trigger)]>,
    queue: mpsc::Sender<(Key, Event)>,
    /// The windows open, shared with the trigger task, which closes them.
    open: Arc<Mutex<OpenWindows>>,
    quota: WindowQuota,
    /// Where the sessions' agents live (a window of one that does not will
    /// start it).
    supervisor: Supervisor,
}

/// The windows open, by session and by tenant.
#[derive(Default)]
struct OpenWindows {
    by_key: HashMap<Key, Window>,
    by_tenant: HashMap<Option<String>, Held>,
}

/// One open window: the bytes waiting in it, and whether it starts an agent.
#[derive(Default, Clone, Copy)]
struct Window {
    bytes: usize,
    starts: bool,
}

/// What a tenant's open windows hold.
#[derive(Default, Clone, Copy)]
struct Held {
    windows: usize,
    bytes: usize,
    starting: usize,
}

impl OpenWindows {
    /// The window of `key` closed: its bytes are free.
    fn close(&mut self, key: &Key) {
        let Some(window) = self.by_key.remove(key) else {
            return;
        };
        if let Some(held) = self.by_tenant.get_mut(&key.tenant) {
            held.windows = held.windows.saturating_sub(1);
            held.bytes = held.bytes.saturating_sub(window.bytes);
            held.starting = held.starting.saturating_sub(usize::from(window.starts));
            if held.windows == 0 {
                self.by_tenant.remove(&key.tenant);
            }
        }
    }
}

fn lock(open: &Mutex<OpenWindows>) -> std::sync::MutexGuard<'_, OpenWindows> {
    open.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A session a trigger starts: the tenant's (and the user's), of a definition,
/// by key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    tenant: Option<String>,
    user: Option<String>,
    definition: String,
    session: String,
    /// Events of another topic gather in a window of their own.
    topic: String,
    debounce: Duration,
}

impl Key {
    /// The id of the session (and its agent): the tenant, the user when there
    /// is one, the definition and the key, each with `%` and `:` escaped, joined
    /// by `:`.
    fn id(&self) -> String {
        // `/`, `#` and `@` are kept for sub-agents' sessions.
        let escape = |part: &str| {
            part.replace('%', "%25")
                .replace(':', "%3A")
                .replace('/', "%2F")
                .replace('#', "%23")
                .replace('@', "%40")
        };
        let tenant = escape(
            self.tenant
                .as_deref()
                .unwrap_or(tiller_core::DEFAULT_TENANT),
        );
        let (definition, session) = (escape(&self.definition), escape(&self.session));
        match &self.user {
            None => format!("{tenant}:{definition}:{session}"),
            Some(user) => format!("{tenant}:{}:{definition}:{session}", escape(user)),
        }
    }
}

impl Triggers {
    /// The triggers of the latest version of each of `definitions`, their agents
    /// spawned by `supervisor`, installed as its event sink (so that
    /// [`Supervisor::publish`] reaches them).
    pub fn attach(supervisor: &Supervisor, definitions: Definitions) -> Self {
        let spawning = supervisor.clone();
        let spawner: Spawner = Arc::new(move |arrival: Arrival| {
            let supervisor = spawning.clone();
            Box::pin(async move {
                supervisor
                    .spawn(arrival.spec)
                    .await
                    .map(Spawned::Here)
                    .map_err(|e| e.to_string())
            })
        });
        Triggers::attach_with(supervisor, definitions, spawner)
    }

    /// [`Triggers::attach`] with agents made by `spawner`, each tenant held to
    /// [`DEFAULT_WINDOWS`] windows holding [`DEFAULT_WINDOW_BYTES`].
    pub fn attach_with(
        supervisor: &Supervisor,
        definitions: Definitions,
        spawner: Spawner,
    ) -> Self {
        let quota: WindowQuota = Arc::new(|_| WindowLimits::default());
        Triggers::attach_limited(supervisor, definitions, spawner, quota)
    }

    /// [`Triggers::attach_with`], each tenant held to the windows and bytes
    /// `quota` gives it.
    pub fn attach_limited(
        supervisor: &Supervisor,
        definitions: Definitions,
        spawner: Spawner,
        quota: WindowQuota,
    ) -> Self {
        let triggers: Vec<(String, Trigger)> = definitions
            .latest()
            .flat_map(|file| {
                file.triggers
                    .iter()
                    .map(|trigger| (file.name.clone(), trigger.clone()))
            })
            .collect();
        let (queue, events) = mpsc::channel(QUEUE);
        let open = Arc::new(Mutex::new(OpenWindows::default()));
        let delivery = Delivery {
            supervisor: supervisor.clone(),
            definitions,
            spawner,
            open: open.clone(),
        };
        tokio::spawn(gather(events, Arc::new(delivery)));
        let triggers = Triggers {
            triggers: triggers.into(),
            queue,
            open,
            quota,
            supervisor: supervisor.clone(),
        };
        if !supervisor.set_event_sink(Arc::new(triggers.clone())) {
            tracing::warn!(
                "the supervisor already has an event sink: these triggers are not the ones it publishes to"
            );
        }
        triggers
    }
}

impl EventSink for Triggers {
    fn publish(&self, event: Event) -> Result<usize, EventError> {
        event.check()?;
        let mut matched = 0;
        // Each session's key, and its id.
        let mut keys = HashMap::new();
        for (definition, trigger) in self.triggers.iter() {
            if !trigger.matches(&event) {
                continue;
            }
            let Some(session) = trigger.session_key(&event.payload) else {
                continue;
            };
            matched += 1;
            let key = Key {
                tenant: event.tenant.clone(),
                user: event.user.clone(),
                definition: definition.clone(),
                session,
                topic: event.topic.clone(),
                debounce: Duration::from_millis(trigger.debounce_ms),
            };
            // Refused here, not dropped when its agent cannot start.
            let id = key.id();
            tiller_runtime::check_id("session", &id).map_err(|_| {
                EventError::Key(format!(
                    "the trigger of `{definition}` makes the key {:?}, which cannot name a session: a session id is at most {} bytes, without control characters",
                    truncated(&key.session),
                    tiller_runtime::MAX_ID_BYTES
                ))
            })?;
            keys.insert(key, id);
        }
        if keys.is_empty() {
            return Ok(matched);
        }
        // Each session gets the event once, however many of its triggers match;
        // what it adds to the tenant's windows is counted before it is taken.
        let bytes = serde_json::to_string(&event.payload).map_or(0, |json| json.len());
        let limits = (self.quota)(event.tenant.as_deref());
        let mut open = lock(&self.open);
        let held = open
            .by_tenant
            .get(&event.tenant)
            .copied()
            .unwrap_or_default();
        // The windows this event opens, and whether each will start an agent.
        let opening: Vec<(Key, bool)> = keys
            .iter()
            .filter(|(key, _)| !open.by_key.contains_key(*key))
            .map(|(key, id)| (key.clone(), self.supervisor.get(id).is_none()))
            .collect();
        let starting = opening.iter().filter(|(_, starts)| *starts).count();
        let past = |quota, max| Err(EventError::Quota { quota, max });
        if held.windows + opening.len() > limits.windows {
            return past("trigger_windows", limits.windows);
        }
        if held.starting + starting > limits.agents {
            return past("agents", limits.agents);
        }
        if held.bytes.saturating_add(bytes.saturating_mul(keys.len())) > limits.bytes {
            return past("trigger_bytes", limits.bytes);
        }
        if self.queue.capacity() < keys.len() {
            return Err(EventError::Full);
        }
        let tenant = open.by_tenant.entry(event.tenant.clone()).or_default();
        tenant.windows += opening.len();
        tenant.starting += starting;
        tenant.bytes += bytes * keys.len();
        for (key, starts) in opening {
            open.by_key.insert(key, Window { bytes: 0, starts });
        }
        for key in keys.into_keys() {
            if let Some(window) = open.by_key.get_mut(&key) {
                window.bytes += bytes;
            }
            self.queue
                .try_send((key, event.clone()))
                .map_err(|_| EventError::Closed)?;
        }
        Ok(matched)
    }
}

/// What delivers a gathered batch.
struct Delivery {
    supervisor: Supervisor,
    definitions: Definitions,
    spawner: Spawner,
    /// A window counts as open until its batch is delivered: until its agent
    /// is live (counted in the tenant's agents) or cannot be.
    open: Arc<Mutex<OpenWindows>>,
}

/// The events of one window, waiting for it to close.
struct Batch {
    topic: String,
    payloads: Vec<Value>,
    /// Its window in the task's queue of windows.
    window: tokio_util::time::delay_queue::Key,
}

/// The trigger task: gathers each session's events until its window closes (or
/// its batch fills), then delivers them as one prompt.
async fn gather(mut events: mpsc::Receiver<(Key, Event)>, delivery: Arc<Delivery>) {
    let mut open: HashMap<Key, Batch> = HashMap::new();
    let mut windows = tokio_util::time::DelayQueue::new();
    loop {
        tokio::select! {
            received = events.recv() => {
                let Some((key, event)) = received else { break };
                let batch = open.entry(key.clone()).or_insert_with(|| Batch {
                    topic: event.topic.clone(),
                    payloads: Vec::new(),
                    window: windows.insert(key.clone(), key.debounce),
                });
                batch.payloads.push(event.payload);
                // A full batch goes now, its window closed with it.
                if batch.payloads.len() >= MAX_BATCH
                    && let Some(batch) = open.remove(&key)
                {
                    windows.remove(&batch.window);
                    tokio::spawn(delivery.clone().deliver(key, batch));
                }
            }
            Some(closed) = futures::StreamExt::next(&mut windows), if !windows.is_empty() => {
                let key = closed.into_inner();
                if let Some(batch) = open.remove(&key) {
                    tokio::spawn(delivery.clone().deliver(key, batch));
                }
            }
        }
    }
}

impl Delivery {
    /// Prompts the session's agent with the batch: spawned (or resumed from the
    /// store) when it is not running, thawed when it sleeps, a follow-up when busy.
    async fn deliver(self: Arc<Self>, key: Key, batch: Batch) {
        /// Closes the window however the delivery ends.
        struct Closing<'a>(&'a Mutex<OpenWindows>, &'a Key);
        impl Drop for Closing<'_> {
            fn drop(&mut self) {
                lock(self.0).close(self.1);
            }
        }
        let _closing = Closing(&self.open, &key);
        let id = key.id();
        let prompt = prompt_of(&batch);
        let agent = match self.supervisor.get(&id) {
            Some(agent) => agent,
            None => {
                let spec = match self.definitions.spec(&key.definition, None) {
                    Ok(spec) => spec
                        .with_id(id.clone())
                        .with_session(id.clone())
                        .with_owner(key.tenant.clone(), key.user.clone()),
                    Err(error) => {
                        tracing::warn!(session = %id.escape_debug(), %error, "a trigger's definition cannot be used");
                        return;
                    }
                };
                let arrival = Arrival {
                    spec,
                    definition: key.definition.clone(),
                    tenant: key.tenant.clone(),
                    prompt: prompt.clone(),
                };
                match (self.spawner)(arrival).await {
                    Ok(Spawned::Here(agent)) => agent,
                    Ok(Spawned::Delivered) => return,
                    Err(error) => match self.supervisor.get(&id) {
                        // Another delivery made it meanwhile.
                        Some(agent) => agent,
                        None => {
                            tracing::warn!(session = %id.escape_debug(), %error, "a trigger's agent could not start");
                            return;
                        }
                    },
                }
            }
        };
        let delivered = match agent.prompt(prompt.clone()).await {
            Err(AgentError::Busy) => follow_up(&agent, prompt).await,
            other => other,
        };
        if let Err(error) = delivered {
            tracing::warn!(session = %id.escape_debug(), %error, "a trigger's prompt was refused");
        }
    }
}

/// `prompt` queued as a follow-up of the run `agent` is busy with; a run of
/// its own should that run have ended meanwhile (a follow-up queued while the
/// agent is idle waits for its next prompt). [`AgentError::Busy`] answers
/// that a run will take it, [`AgentError::CannotStart`] that one took it or
/// that it waits, queued, for the agent to take runs again (a reply the user
/// owes it).
async fn follow_up(agent: &AgentHandle, prompt: String) -> Result<(), AgentError> {
    agent.follow_up(crate::AgentMessage::user(prompt)).await?;
    match agent.submit(Op::Continue).await {
        Err(AgentError::Busy | AgentError::CannotStart(_)) => Ok(()),
        other => other,
    }
}

/// The start of `key` for an error: at most 64 characters of it.
fn truncated(key: &str) -> String {
    match key.char_indices().nth(64) {
        Some((at, _)) => format!("{}…", &key[..at]),
        None => key.to_owned(),
    }
}

/// The prompt of a batch: the topic, then each payload as JSON, numbered.
fn prompt_of(batch: &Batch) -> String {
    let mut prompt = match batch.payloads.len() {
        1 => format!("Event `{}`:", batch.topic),
        n => format!("{n} events `{}`:", batch.topic),
    };
    for (n, payload) in batch.payloads.iter().enumerate() {
        prompt.push_str(&format!("\n{}. {payload}", n + 1));
    }
    prompt
}

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;
    use serde_json::json;

    use super::*;

    fn trigger(yaml: &str) -> Trigger {
        serde_saphyr::from_str(yaml).unwrap()
    }

    #[test]
    fn a_trigger_matches_its_topic_and_fields_and_names_a_session() {
        let paid = trigger(
            "on: order.paid\nmatch: {currency: EUR, customer.tier: gold}\nsession: \"order-{order.id}\"\n",
        );
        let event = |payload: Value| Event::new("order.paid", payload);
        let gold = json!({"currency": "EUR", "customer": {"tier": "gold"}, "order": {"id": 42}});
        assert!(paid.matches(&event(gold.clone())));
        assert_eq!(paid.session_key(&gold).as_deref(), Some("order-42"));
        assert!(!paid.matches(&event(
            json!({"currency": "USD", "customer": {"tier": "gold"}})
        )));
        assert!(!paid.matches(&event(json!({"currency": "EUR"}))));
        assert!(!paid.matches(&Event::new("order.refunded", gold.clone())));
        // A session field the payload lacks: no session.
        assert_eq!(paid.session_key(&json!({"currency": "EUR"})), None);
        // No session template: one session.
        assert_eq!(
            trigger("on: tick\n").session_key(&json!({})).as_deref(),
            Some("")
        );
    }

    #[test]
    fn bad_triggers_are_refused_with_their_field() {
        for (yaml, field) in [
            ("on: \"\"\n", "on"),
            ("on: t\ndebounce_ms: 3600001\n", "debounce_ms"),
            ("on: t\nsession: \"a-{id\"\n", "session"),
            ("on: t\nsession: \"a-{}\"\n", "session"),
        ] {
            assert_eq!(trigger(yaml).check().unwrap_err().0, field, "{yaml}");
        }
        assert!(trigger("on: t\nsession: \"{a}-{b.c}\"\n").check().is_ok());
    }

    #[test]
    fn session_ids_keep_tenants_and_keys_apart() {
        let key = |tenant: Option<&str>, session: &str| Key {
            tenant: tenant.map(str::to_owned),
            user: None,
            definition: "support".into(),
            session: session.into(),
            topic: "t".into(),
            debounce: Duration::ZERO,
        };
        assert_eq!(key(None, "t-1").id(), "default:support:t-1");
        assert_eq!(key(Some("acme"), "a:b%").id(), "acme:support:a%3Ab%25");
        assert_eq!(key(None, "x/y#z@w").id(), "default:support:x%2Fy%23z%40w");
        assert_ne!(key(Some("a:b"), "c").id(), key(Some("a"), "b:c").id());
        // A user's event: the user's own session, apart from the tenant's.
        let users = Key {
            user: Some("ann:1".into()),
            ..key(Some("acme"), "t-1")
        };
        assert_eq!(users.id(), "acme:ann%3A1:support:t-1");
        assert_ne!(users.id(), key(Some("acme"), "ann:1:support:t-1").id());
    }

    /// A batch that found its agent busy and was queued as the run ended is
    /// not left waiting for the next prompt.
    #[tokio::test]
    async fn a_follow_up_that_finds_the_agent_idle_gets_a_run() {
        let faux = tiller_ai::faux::FauxProvider::new();
        faux.push(tiller_ai::faux::FauxTurn::text("First."));
        faux.push(tiller_ai::faux::FauxTurn::text("Second."));
        let supervisor = Supervisor::start().await.unwrap();
        let agent = supervisor
            .spawn(AgentSpec::new(tiller_runtime::AgentSettings::new(
                faux.model(),
            )))
            .await
            .unwrap();
        agent.run("One.").await.unwrap();
        follow_up(&agent, "Two.".to_owned()).await.unwrap();
        agent.wait_for_idle().await;
        let state = agent.state().await.unwrap();
        let said: Vec<_> = state.messages.iter().map(|m| m.role()).collect();
        assert_eq!(said, ["user", "assistant", "user", "assistant"]);
        assert_eq!(state.messages[2].as_user().unwrap().text_content(), "Two.");
        supervisor.shutdown().await;
    }
}
