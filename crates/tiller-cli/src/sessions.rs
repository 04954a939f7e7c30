//! `tiller sessions`: the sessions a store keeps, and where the store is.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use tiller::AgentMessage;
use tiller::store::{self, SessionFilter, SessionStore, StoredSession};

use crate::cli::SessionsAction;
use crate::outcome::Exit;

/// The store `--store` names, else `$TILLER_STORE`, else the SQLite file under the
/// user's data directory.
pub fn store_url(option: Option<&str>) -> Result<String, String> {
    if let Some(url) = option.map(str::to_owned).or_else(|| {
        std::env::var("TILLER_STORE")
            .ok()
            .filter(|url| !url.trim().is_empty())
    }) {
        return Ok(url);
    }
    let data = std::env::var_os("XDG_DATA_HOME")
        .filter(|dir| !dir.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".local/share")))
        .ok_or("no data directory: set HOME or XDG_DATA_HOME, or pass --store URL")?;
    let dir = data.join("tiller");
    std::fs::create_dir_all(&dir)
        .map_err(|error| format!("cannot create {}: {error}", dir.display()))?;
    Ok(format!("sqlite://{}", dir.join("sessions.db").display()))
}

/// Opens the store `option` (or the default) names; says why not on stderr.
pub async fn open_store(option: Option<&str>) -> Result<Arc<dyn SessionStore>, Exit> {
    let url = store_url(option).map_err(Exit::usage)?;
    store::open(&url).await.map_err(Exit::failed)
}

/// Runs `tiller sessions ACTION`.
pub async fn sessions(action: &SessionsAction, store: Option<&str>) -> Exit {
    let store = match open_store(store).await {
        Ok(store) => store,
        Err(exit) => return exit,
    };
    let done = match action {
        SessionsAction::List => list(&*store, SessionFilter::default()).await,
        SessionsAction::Branches { name } => {
            let branches = SessionFilter {
                parent: Some(name.clone()),
                ..SessionFilter::default()
            };
            list(&*store, branches).await
        }
        SessionsAction::Fork { name, at, id } => {
            let branch = id.clone().unwrap_or_else(tiller::ai::new_id);
            match tiller::runtime::fork_stored(&*store, name, *at, &branch).await {
                Ok(()) => {
                    println!("{branch}");
                    Ok(())
                }
                Err(error) => Err(error.to_string()),
            }
        }
        SessionsAction::Show { name, json } => show(&*store, name, *json).await,
        SessionsAction::Rm {
            name: Some(name), ..
        } => match store.delete(name).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(format!("no session named `{name}`")),
            Err(error) => Err(error.to_string()),
        },
        SessionsAction::Rm { tenant, .. } => {
            remove_tenant(&*store, tenant.as_deref().unwrap_or_default()).await
        }
        SessionsAction::Prune { older_than_days } => {
            let age = std::time::Duration::from_secs(older_than_days.saturating_mul(24 * 3_600));
            match store.prune(tiller::store::ago(age)).await {
                Ok(pruned) => {
                    println!("{pruned} closed session(s) deleted");
                    Ok(())
                }
                Err(error) => Err(error.to_string()),
            }
        }
    };
    match done {
        Ok(()) => Exit::Success,
        Err(message) => {
            crate::say!("tiller: {message}");
            Exit::Failed
        }
    }
}

/// Deletes every session of `tenant`, a page at a time; says how many.
async fn remove_tenant(store: &dyn SessionStore, tenant: &str) -> Result<(), String> {
    let page = SessionFilter {
        tenant_id: Some(tenant.to_owned()),
        limit: Some(500),
        ..SessionFilter::default()
    };
    let mut deleted = 0usize;
    loop {
        let sessions = store.list(&page).await.map_err(|error| error.to_string())?;
        let before = deleted;
        let listed = sessions.len();
        for info in sessions {
            // A sub-agent's session may have gone with its parent's.
            if store
                .delete(&info.record.id)
                .await
                .map_err(|error| error.to_string())?
            {
                deleted += 1;
            }
        }
        if listed == 0 || deleted == before {
            break;
        }
    }
    if deleted == 0 {
        return Err(format!("no session of tenant `{tenant}`"));
    }
    println!("{deleted} session(s) of tenant {tenant} deleted");
    Ok(())
}

async fn list(store: &dyn SessionStore, filter: SessionFilter) -> Result<(), String> {
    let sessions = store
        .list(&filter)
        .await
        .map_err(|error| error.to_string())?;
    for info in sessions {
        let record = &info.record;
        let branch = record.branch.as_ref().map_or_else(String::new, |branch| {
            format!("\tbranch of {} at {}", branch.parent, branch.at)
        });
        println!(
            "{}\t{} messages\t{}\t{}{branch}",
            record.id,
            info.messages,
            record.status.as_str(),
            when(record.updated_at)
        );
    }
    Ok(())
}

async fn show(store: &dyn SessionStore, name: &str, json: bool) -> Result<(), String> {
    let stored = store
        .load(name)
        .await
        .map_err(|error| error.to_string())?
        .ok_or_else(|| format!("no session named `{name}`"))?;
    if json {
        println!("{}", as_json(&stored));
        return Ok(());
    }
    let record = &stored.record;
    println!(
        "session {} · {} · created {} · updated {}",
        record.id,
        record.status.as_str(),
        when(record.created_at),
        when(record.updated_at)
    );
    for message in &stored.messages {
        println!("{}", line(message));
    }
    for queued in &stored.steering {
        println!("(steering queued) {}", line(&queued.message));
    }
    for queued in &stored.follow_up {
        println!("(follow-up queued) {}", line(&queued.message));
    }
    Ok(())
}

/// A stored session as JSON: its row, messages and queues.
fn as_json(stored: &StoredSession) -> serde_json::Value {
    serde_json::json!({
        "session": stored.record,
        "messages": stored.messages,
        "steering": queued(&stored.steering),
        "follow_up": queued(&stored.follow_up),
    })
}

fn queued(queued: &[store::Queued]) -> Vec<&AgentMessage> {
    queued.iter().map(|queued| &queued.message).collect()
}

/// One message as a line: its role and text (tool calls named).
fn line(message: &AgentMessage) -> String {
    let text = match message {
        AgentMessage::Llm(tiller::ai::Message::Assistant(assistant)) => {
            let calls: Vec<String> = assistant
                .tool_calls()
                .map(|call| format!("[calls {}({})]", call.name, call.arguments))
                .collect();
            [assistant.text(), calls.join(" ")]
                .into_iter()
                .filter(|part| !part.is_empty())
                .collect::<Vec<_>>()
                .join(" ")
        }
        AgentMessage::Llm(tiller::ai::Message::ToolResult(result)) => result.text_content(),
        AgentMessage::Llm(tiller::ai::Message::User(user)) => user
            .content
            .iter()
            .filter_map(|content| match content {
                tiller::ai::Content::Text(text) => Some(text.text.as_str()),
                _ => None,
            })
            .collect(),
        AgentMessage::Custom(custom) => {
            match tiller::run::compaction::CompactionSummary::of(message) {
                Some(summary) => format!(
                    "compaction of message:{} to message:{}, the {} messages after it kept as they were: {}",
                    summary.first_seq, summary.last_seq, summary.kept, summary.summary
                ),
                None => custom.kind.clone(),
            }
        }
    };
    format!("{}: {}", message.role(), text.replace('\n', " "))
}

/// A stored time, as an HTTP date (UTC).
fn when(millis: i64) -> String {
    let at = UNIX_EPOCH + Duration::from_millis(u64::try_from(millis).unwrap_or_default());
    httpdate::fmt_http_date(at)
}
