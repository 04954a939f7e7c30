//! One suite, three stores: every store keeps the same sessions the same way.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use pretty_assertions::assert_eq;
use serde_json::json;
use tiller_ai::FileContent;
use tiller_core::AgentMessage;
use tiller_store::{
    Branch, Change, MAX_BRANCH_DEPTH, MAX_OP_KEYS, MAX_WORKING_MEMORY_BYTES, Memory, MemoryOwner,
    MemoryStore, QueueKind, Queued, SessionFilter, SessionRecord, SessionStatus, SessionStore,
    SessionWrite, SqlStore, StoreError, StoreWriter, StoredSession,
};
use tiller_store::{Embedding, file_id};
use tiller_test_support::sqlite::TempSqlite;

/// A tenant no other test uses, so tests can share one PostgreSQL database.
fn tenant(test: &str) -> String {
    format!("{test}-{}-{}", std::process::id(), tiller_ai::now_ms())
}

fn record(id: &str, tenant: &str, user: &str) -> SessionRecord {
    SessionRecord {
        tenant_id: Some(tenant.to_owned()),
        user_id: Some(user.to_owned()),
        name: Some("assistant".to_owned()),
        definition: json!({"model": "faux/scripted", "system_prompt": "Be brief."}).into(),
        ..SessionRecord::new(id)
    }
}

/// A user message with a fixed timestamp, so stored and expected compare equal.
fn user(text: impl Into<String>) -> AgentMessage {
    let mut message = tiller_ai::UserMessage::text(text);
    message.timestamp = 1_700_000_000_000;
    message.into()
}

fn write(session: &str, change: Change) -> SessionWrite {
    SessionWrite::new(session, change)
}

/// `loaded` with its `updated_at` as `expected` has it (the store sets it).
fn same_time(mut loaded: StoredSession, expected: &StoredSession) -> StoredSession {
    assert!(loaded.record.updated_at >= expected.record.created_at);
    loaded.record.updated_at = expected.record.updated_at;
    loaded
}

async fn keeps_messages_queues_and_definition(store: Arc<dyn SessionStore>, tenant: &str) {
    let id = format!("{tenant}-a");
    let created = record(&id, tenant, "ada");
    let writer = StoreWriter::for_store(store.clone());
    writer
        .write(vec![
            write(&id, Change::Create(created.clone())),
            write(
                &id,
                Change::Append {
                    seq: 0,
                    message: user("hello").into(),
                    dequeued: None,
                },
            ),
            write(
                &id,
                Change::Enqueue {
                    queue: QueueKind::Steering,
                    seq: 0,
                    message: user("steer 1"),
                },
            ),
            write(
                &id,
                Change::Enqueue {
                    queue: QueueKind::FollowUp,
                    seq: 1,
                    message: user("later"),
                },
            ),
            write(
                &id,
                Change::Enqueue {
                    queue: QueueKind::Steering,
                    seq: 2,
                    message: user("steer 2"),
                },
            ),
        ])
        .await
        .unwrap();
    // Delivered from the queue: appended and dequeued in one write.
    writer
        .write(vec![write(
            &id,
            Change::Append {
                seq: 1,
                message: user("steer 1").into(),
                dequeued: Some(0),
            },
        )])
        .await
        .unwrap();
    let mut expected = StoredSession {
        record: created.clone(),
        messages: vec![user("hello").into(), user("steer 1").into()],
        steering: vec![Queued {
            seq: 2,
            message: user("steer 2"),
        }],
        follow_up: vec![Queued {
            seq: 1,
            message: user("later"),
        }],
        op_keys: Vec::new(),
    };
    let loaded = store.load(&id).await.unwrap().unwrap();
    assert_eq!(same_time(loaded, &expected), expected);

    writer
        .write(vec![
            write(&id, Change::ClearQueue(QueueKind::Steering)),
            write(
                &id,
                Change::SetDefinition(json!({"model": "openai/gpt-4o-mini"}).into()),
            ),
            write(&id, Change::SetStatus(SessionStatus::Closed)),
            write(&id, Change::Truncate { from: 1 }),
        ])
        .await
        .unwrap();
    expected.steering.clear();
    expected.messages.truncate(1);
    expected.record.definition = json!({"model": "openai/gpt-4o-mini"}).into();
    expected.record.status = SessionStatus::Closed;
    let loaded = store.load(&id).await.unwrap().unwrap();
    assert_eq!(same_time(loaded, &expected), expected);
    assert_eq!(
        store.messages(&id, 0, 10).await.unwrap(),
        vec![user("hello").into()]
    );
    assert_eq!(store.messages(&id, 1, 10).await.unwrap(), vec![]);
    assert_eq!(store.load("no-such-session").await.unwrap(), None);

    // Reset: everything emptied, the session kept.
    writer
        .write(vec![
            write(&id, Change::Truncate { from: 0 }),
            write(&id, Change::ClearQueue(QueueKind::Steering)),
            write(&id, Change::ClearQueue(QueueKind::FollowUp)),
            write(
                &id,
                Change::Append {
                    seq: 0,
                    message: user("again").into(),
                    dequeued: None,
                },
            ),
        ])
        .await
        .unwrap();
    let loaded = store.load(&id).await.unwrap().unwrap();
    assert_eq!(loaded.messages, vec![user("again").into()]);
    assert_eq!((loaded.steering.len(), loaded.follow_up.len()), (0, 0));

    assert!(store.delete(&id).await.unwrap());
    assert!(!store.delete(&id).await.unwrap());
    assert_eq!(store.load(&id).await.unwrap(), None);
}

async fn a_failed_batch_changes_nothing(store: Arc<dyn SessionStore>, tenant: &str) {
    let id = format!("{tenant}-b");
    let writer = StoreWriter::for_store(store.clone());
    writer
        .write(vec![write(&id, Change::Create(record(&id, tenant, "ada")))])
        .await
        .unwrap();
    let before = store.load(&id).await.unwrap().unwrap();

    let again = writer
        .write(vec![
            write(
                &id,
                Change::Append {
                    seq: 0,
                    message: user("lost").into(),
                    dequeued: None,
                },
            ),
            write(&id, Change::Create(record(&id, tenant, "ada"))),
        ])
        .await;
    assert_eq!(again, Err(StoreError::SessionExists(id.clone())));
    let missing = format!("{tenant}-missing");
    let orphan = writer
        .write(vec![
            write(
                &id,
                Change::Append {
                    seq: 0,
                    message: user("lost too").into(),
                    dequeued: None,
                },
            ),
            write(
                &missing,
                Change::Append {
                    seq: 0,
                    message: user("orphan").into(),
                    dequeued: None,
                },
            ),
        ])
        .await;
    assert_eq!(orphan, Err(StoreError::NoSuchSession(missing.clone())));
    assert_eq!(
        store.load(&id).await.unwrap().unwrap().messages,
        before.messages
    );
    assert_eq!(store.load(&missing).await.unwrap(), None);
}

async fn lists_by_owner_and_status(store: Arc<dyn SessionStore>, tenant: &str) {
    let tenant = &format!("{tenant}-listed");
    let writer = StoreWriter::for_store(store.clone());
    for (n, owner) in ["ada", "bob", "ada"].into_iter().enumerate() {
        let id = format!("{tenant}-list-{n}");
        let mut writes = vec![write(&id, Change::Create(record(&id, tenant, owner)))];
        for seq in 0..n as u64 {
            writes.push(write(
                &id,
                Change::Append {
                    seq,
                    message: user(format!("m{seq}")).into(),
                    dequeued: None,
                },
            ));
        }
        writer.write(writes).await.unwrap();
    }
    writer
        .write(vec![write(
            &format!("{tenant}-list-0"),
            Change::SetStatus(SessionStatus::Closed),
        )])
        .await
        .unwrap();

    let listed = |filter: SessionFilter| {
        let store = store.clone();
        async move {
            store
                .list(&filter)
                .await
                .unwrap()
                .into_iter()
                .map(|info| (info.record.id, info.messages))
                .collect::<Vec<_>>()
        }
    };
    let ids = |n: &[(usize, u64)]| {
        n.iter()
            .map(|(n, count)| (format!("{tenant}-list-{n}"), *count))
            .collect::<Vec<_>>()
    };
    let of_tenant = SessionFilter {
        tenant_id: Some(tenant.to_owned()),
        ..SessionFilter::default()
    };
    let mut all = listed(of_tenant.clone()).await;
    all.sort();
    assert_eq!(all, ids(&[(0, 0), (1, 1), (2, 2)]));
    let mut ada = listed(SessionFilter {
        user_id: Some("ada".to_owned()),
        ..of_tenant.clone()
    })
    .await;
    ada.sort();
    assert_eq!(ada, ids(&[(0, 0), (2, 2)]));
    assert_eq!(
        listed(SessionFilter {
            status: Some(SessionStatus::Closed),
            ..of_tenant.clone()
        })
        .await,
        ids(&[(0, 0)])
    );
    // Most recently changed first.
    let times: Vec<i64> = store
        .list(&of_tenant)
        .await
        .unwrap()
        .iter()
        .map(|info| info.record.updated_at)
        .collect();
    assert!(times.windows(2).all(|pair| pair[0] >= pair[1]), "{times:?}");
    assert_eq!(
        listed(SessionFilter {
            id: Some(format!("{tenant}-list-2")),
            ..of_tenant.clone()
        })
        .await,
        ids(&[(2, 2)])
    );
    // A transcript read a page at a time.
    let paged = format!("{tenant}-list-2");
    assert_eq!(
        store.messages(&paged, 0, 1).await.unwrap(),
        vec![user("m0").into()]
    );
    assert_eq!(
        store.messages(&paged, 1, 5).await.unwrap(),
        vec![user("m1").into()]
    );
    assert_eq!(store.messages(&paged, 2, 5).await.unwrap(), vec![]);
    assert_eq!(
        listed(SessionFilter {
            limit: Some(2),
            ..of_tenant
        })
        .await
        .len(),
        2
    );
}

async fn groups_many_writers_in_order(store: Arc<dyn SessionStore>, tenant: &str) {
    let writer = StoreWriter::for_store(store.clone());
    let sessions: Vec<String> = (0..50).map(|n| format!("{tenant}-w{n}")).collect();
    let creates = sessions
        .iter()
        .map(|id| write(id, Change::Create(record(id, tenant, "ada"))))
        .collect();
    writer.write(creates).await.unwrap();
    // 50 agents, 20 messages each, submitted without waiting, acknowledged in order.
    let (done, mut acks) = tokio::sync::mpsc::unbounded_channel();
    for seq in 0..20u64 {
        for id in &sessions {
            let done = done.clone();
            let id_for_ack = id.clone();
            writer.submit(
                vec![write(
                    id,
                    Change::Append {
                        seq,
                        message: user(format!("{id} {seq}")).into(),
                        dequeued: None,
                    },
                )],
                Some(Box::new(move |result| {
                    let _ = done.send((id_for_ack, seq, result));
                })),
            );
        }
    }
    // One request in the middle fails; the others in its group still commit.
    let missing = format!("{tenant}-nobody");
    let failed = writer.write(vec![write(
        &missing,
        Change::Append {
            seq: 0,
            message: user("x").into(),
            dequeued: None,
        },
    )]);
    assert_eq!(failed.await, Err(StoreError::NoSuchSession(missing)));
    drop(done);
    let mut last_seq = std::collections::HashMap::new();
    while let Some((id, seq, result)) = acks.recv().await {
        assert_eq!(result, Ok(()));
        let previous = last_seq.insert(id, seq);
        assert!(
            previous.is_none_or(|previous| previous + 1 == seq),
            "acknowledged in order"
        );
    }
    for id in &sessions {
        let messages = store.load(id).await.unwrap().unwrap().messages;
        let expected: Vec<Arc<AgentMessage>> = (0..20)
            .map(|seq| user(format!("{id} {seq}")).into())
            .collect();
        assert_eq!(messages, expected);
    }
}

/// Session `branch`, with `record`, forked from `parent` at message `at`.
fn fork(branch: &str, parent: &str, at: u64, record: SessionRecord) -> SessionWrite {
    write(
        branch,
        Change::Fork {
            parent: parent.into(),
            at,
            record,
        },
    )
}

fn append(session: &str, seq: u64, message: &Arc<AgentMessage>) -> SessionWrite {
    write(
        session,
        Change::Append {
            seq,
            message: message.clone(),
            dequeued: None,
        },
    )
}

/// Messages written together (a spawned transcript, some too large to share a
/// row) and one at a time read back the same: whole, a page at a time from any
/// place, counted, and cut anywhere.
async fn pages_and_cuts_a_transcript_anywhere(store: Arc<dyn SessionStore>, tenant: &str) {
    let writer = StoreWriter::for_store(store.clone());
    let large = "x".repeat(40 << 10);
    for (id, text) in [("runs", "m"), ("large-runs", large.as_str())] {
        let id = format!("{tenant}-{id}");
        let mut all: Vec<Arc<AgentMessage>> = (0..8)
            .map(|n| Arc::new(user(format!("{text}{n}"))))
            .collect();
        let mut first = vec![write(&id, Change::Create(record(&id, tenant, "ada")))];
        first.extend((0..5).map(|seq| append(&id, seq, &all[seq as usize])));
        writer.write(first).await.unwrap();
        writer.write(vec![append(&id, 5, &all[5])]).await.unwrap();
        writer
            .write(vec![append(&id, 6, &all[6]), append(&id, 7, &all[7])])
            .await
            .unwrap();
        assert_eq!(store.load(&id).await.unwrap().unwrap().messages, all);
        for from in 0..=9 {
            for limit in [1, 2, 3, 10] {
                let end = (from + limit).min(all.len());
                assert_eq!(
                    store
                        .messages(&id, from as u64, limit as u32)
                        .await
                        .unwrap(),
                    all[from.min(end)..end],
                    "{id}: {limit} from {from}"
                );
            }
        }
        let counted = SessionFilter {
            id: Some(id.clone()),
            ..SessionFilter::default()
        };
        assert_eq!(store.list(&counted).await.unwrap()[0].messages, 8);

        // Cut inside what the first write brought, and go on from there.
        all.truncate(3);
        all.push(Arc::new(user("again")));
        writer
            .write(vec![
                write(&id, Change::Truncate { from: 3 }),
                append(&id, 3, &all[3]),
            ])
            .await
            .unwrap();
        assert_eq!(store.load(&id).await.unwrap().unwrap().messages, all);
        assert_eq!(store.messages(&id, 2, 10).await.unwrap(), all[2..]);
        assert_eq!(store.list(&counted).await.unwrap()[0].messages, 4);
        writer
            .write(vec![write(&id, Change::Truncate { from: 1 })])
            .await
            .unwrap();
        assert_eq!(store.load(&id).await.unwrap().unwrap().messages, all[..1]);
    }
}

/// A claim takes a session over: the writes of the claim before are refused from
/// then on, naming both epochs, and change nothing; the new holder's go through.
async fn a_claim_fences_the_writer_before(store: Arc<dyn SessionStore>, tenant: &str) {
    let id = format!("{tenant}-claimed");
    let writer = StoreWriter::for_store(store.clone());
    let said = |text: &str, seq: u64, epoch: u64| {
        write(
            &id,
            Change::Append {
                seq,
                message: user(text).into(),
                dequeued: None,
            },
        )
        .at_epoch(epoch)
    };
    writer
        .write(vec![
            write(&id, Change::Create(record(&id, tenant, "ada"))).at_epoch(7),
            said("first", 0, 7),
        ])
        .await
        .unwrap();
    assert_eq!(store.load(&id).await.unwrap().unwrap().record.epoch, 7);

    let claimed = store.claim(&id, None).await.unwrap().unwrap();
    assert_eq!(claimed.record.epoch, 8);
    assert_eq!(claimed.messages, vec![user("first").into()]);
    assert_eq!(store.load(&id).await.unwrap().unwrap().record.epoch, 8);
    let stale = writer.write(vec![said("from the old holder", 1, 7)]).await;
    assert_eq!(
        stale,
        Err(StoreError::TakenOver {
            session: id.clone(),
            epoch: 7,
            current: 8
        })
    );
    // A batch of both holders' writes: the old one's fails alone.
    let (old, new) = futures::join!(
        writer.write(vec![said("old again", 1, 7)]),
        writer.write(vec![said("second", 1, 8)])
    );
    assert!(matches!(old, Err(StoreError::TakenOver { .. })), "{old:?}");
    assert_eq!(new, Ok(()));
    assert_eq!(
        store.load(&id).await.unwrap().unwrap().messages,
        vec![user("first").into(), user("second").into()]
    );

    // A claim at a given epoch (a lease's): not below the current one.
    assert_eq!(
        store.claim(&id, Some(5)).await,
        Err(StoreError::TakenOver {
            session: id.clone(),
            epoch: 5,
            current: 8
        })
    );
    let at = store.claim(&id, Some(20)).await.unwrap().unwrap();
    assert_eq!(at.record.epoch, 20);
    assert_eq!(
        store
            .claim(&id, Some(20))
            .await
            .unwrap()
            .unwrap()
            .record
            .epoch,
        20
    );
    assert_eq!(store.claim(&format!("{tenant}-none"), None).await, Ok(None));
    assert_eq!(
        store.claim(&format!("{tenant}-none"), Some(3)).await,
        Ok(None)
    );
}

/// Deleting a session takes its sub-agents' sessions (`{id}/…`) with it, and no
/// other (not `{id}x`); pruning takes closed sessions last changed before the
/// cut-off, and no active one.
async fn deletes_sub_sessions_and_prunes_closed_ones(store: Arc<dyn SessionStore>, tenant: &str) {
    let writer = StoreWriter::for_store(store.clone());
    let ids = [
        format!("{tenant}-p"),
        format!("{tenant}-p/writer"),
        format!("{tenant}-p/writer/c1"),
        format!("{tenant}-p%"),
        format!("{tenant}-px"),
    ];
    writer
        .write(
            ids.iter()
                .map(|id| write(id, Change::Create(record(id, tenant, "ada"))))
                .collect(),
        )
        .await
        .unwrap();
    let listed = async |store: &Arc<dyn SessionStore>| -> Vec<String> {
        let mut ids: Vec<String> = store
            .list(&SessionFilter {
                tenant_id: Some(tenant.to_owned()),
                ..SessionFilter::default()
            })
            .await
            .unwrap()
            .into_iter()
            .map(|info| info.record.id)
            .collect();
        ids.sort();
        ids
    };
    assert!(store.delete(&ids[0]).await.unwrap());
    assert_eq!(listed(&store).await, [ids[3].clone(), ids[4].clone()]);
    assert!(!store.delete(&ids[0]).await.unwrap());

    let before_closing = tiller_ai::now_ms() as i64 - 1;
    writer
        .write(vec![write(
            &ids[3],
            Change::SetStatus(SessionStatus::Closed),
        )])
        .await
        .unwrap();
    // Closed after the cut-off: kept.
    store.prune(before_closing).await.unwrap();
    assert_eq!(listed(&store).await, [ids[3].clone(), ids[4].clone()]);
    // Closed before it: gone; the active one stays.
    assert!(
        store
            .prune(tiller_ai::now_ms() as i64 + 1_000)
            .await
            .unwrap()
            >= 1
    );
    assert_eq!(listed(&store).await, [ids[4].clone()]);
}

/// A session keeps its origin as given, and the idempotency keys of the ops
/// applied to it: with their op's change, or not at all; each once; the newest
/// `MAX_OP_KEYS`, older ones forgotten when the session is claimed.
/// Origins, contexts and idempotency keys are kept with the session.
async fn keeps_origins_and_idempotency_keys(store: Arc<dyn SessionStore>, tenant: &str) {
    let id = format!("{tenant}-keyed");
    let writer = StoreWriter::for_store(store.clone());
    let origin = json!({"definition": "helper", "version": "2"});
    writer
        .write(vec![write(
            &id,
            Change::Create(SessionRecord {
                origin: origin.clone().into(),
                ..record(&id, tenant, "ada")
            }),
        )])
        .await
        .unwrap();
    let loaded = store.load(&id).await.unwrap().unwrap();
    assert_eq!(loaded.record.origin, origin.clone().into());
    assert_eq!(loaded.record.context, serde_json::Value::Null.into());
    assert!(loaded.op_keys.is_empty());

    // The agent's context, replaced in the write of the message that changed it.
    let context = json!({"ids": {"tenant_id": tenant}, "states": {"issues_discussed": 1}});
    writer
        .write(vec![
            append(&id, 0, &Arc::new(user("noted"))),
            write(&id, Change::SetContext(context.clone().into())),
        ])
        .await
        .unwrap();
    let loaded = store.load(&id).await.unwrap().unwrap();
    assert_eq!(loaded.record.context, context.into());
    assert_eq!(loaded.messages.len(), 1);
    let listed = store.list(&SessionFilter::only(&id)).await.unwrap();
    assert_eq!(listed[0].record.origin, origin.into());

    let key = |n: usize| -> Arc<str> { Arc::from(format!("key-{n:05}")) };
    let keyed = |text: &str, seq: u64, n: usize| {
        vec![
            write(
                &id,
                Change::Enqueue {
                    queue: QueueKind::FollowUp,
                    seq,
                    message: user(text),
                },
            ),
            write(&id, Change::OpKey(key(n))),
        ]
    };
    writer.write(keyed("one", 0, 1)).await.unwrap();
    // The same key again is kept once.
    writer.write(keyed("one", 0, 1)).await.unwrap();
    // A refused batch keeps neither its change nor its key.
    let mut refused = keyed("two", 1, 2);
    refused.push(write(
        &format!("{tenant}-nobody"),
        Change::ClearQueue(QueueKind::Steering),
    ));
    assert!(writer.write(refused).await.is_err());
    let loaded = store.load(&id).await.unwrap().unwrap();
    assert_eq!(loaded.op_keys, vec![key(1)]);
    assert_eq!(loaded.follow_up.len(), 1);

    // Past the bound, the oldest go (in one batch, so their times tie: any
    // `MAX_OP_KEYS` of them may stay, and the newest is among them).
    let many: Vec<SessionWrite> = (2..MAX_OP_KEYS + 10)
        .map(|n| write(&id, Change::OpKey(key(n))))
        .collect();
    writer.write(many).await.unwrap();
    let claimed = store.claim(&id, None).await.unwrap().unwrap();
    assert!(
        claimed.op_keys.len() <= MAX_OP_KEYS,
        "{}",
        claimed.op_keys.len()
    );
    assert!(claimed.op_keys.len() >= MAX_OP_KEYS - 1);
    let loaded = store.load(&id).await.unwrap().unwrap();
    assert_eq!(loaded.op_keys.len(), claimed.op_keys.len());
    writer
        .write(vec![
            write(&id, Change::OpKey(key(99_999))).at_epoch(claimed.record.epoch),
        ])
        .await
        .unwrap();
    let loaded = store.load(&id).await.unwrap().unwrap();
    assert_eq!(loaded.op_keys.last(), Some(&key(99_999)));
    assert!(loaded.op_keys.len() <= MAX_OP_KEYS);

    assert!(store.delete(&id).await.unwrap());
    assert_eq!(store.load(&id).await.unwrap(), None);
}

/// A fork shares its parent's messages up to its place, in runs cut or whole,
/// and goes on with its own; forks of forks, within what they share or past
/// it; its parent's truncation and deletion leave it whole.
async fn branches_share_their_prefix_and_outlive_it(store: Arc<dyn SessionStore>, tenant: &str) {
    let writer = StoreWriter::for_store(store.clone());
    let id = |name: &str| format!("{tenant}-{name}");
    let (root, b1, b2, b3) = (id("root"), id("b1"), id("b2"), id("b3"));
    let all: Vec<Arc<AgentMessage>> = (0..6).map(|n| Arc::new(user(format!("m{n}")))).collect();
    let mut first = vec![write(&root, Change::Create(record(&root, tenant, "ada")))];
    first.extend((0..4).map(|seq| append(&root, seq, &all[seq as usize])));
    writer.write(first).await.unwrap();
    writer.write(vec![append(&root, 4, &all[4])]).await.unwrap();
    writer.write(vec![append(&root, 5, &all[5])]).await.unwrap();
    let fork = |branch: &str, parent: &str, at: u64| {
        fork(branch, parent, at, record(branch, tenant, "ada"))
    };
    let messages = async |session: &str| store.load(session).await.unwrap().unwrap().messages;

    // Within the run the first write brought.
    writer.write(vec![fork(&b1, &root, 2)]).await.unwrap();
    assert_eq!(messages(&b1).await, all[..2]);
    let own = Arc::new(user("b1's own"));
    writer.write(vec![append(&b1, 2, &own)]).await.unwrap();
    let b1_all = [all[0].clone(), all[1].clone(), own.clone()];
    assert_eq!(messages(&b1).await, b1_all);
    assert_eq!(store.messages(&b1, 1, 10).await.unwrap(), b1_all[1..]);
    assert_eq!(store.messages(&b1, 2, 1).await.unwrap(), b1_all[2..]);
    assert_eq!(messages(&root).await, all);
    let loaded = store.load(&b1).await.unwrap().unwrap().record;
    assert_eq!(
        loaded.branch,
        Some(Branch {
            parent: root.clone(),
            at: 2
        })
    );
    // Within what b1 shares, and past it.
    writer
        .write(vec![fork(&b2, &b1, 1), fork(&b3, &b1, 3)])
        .await
        .unwrap();
    assert_eq!(messages(&b2).await, all[..1]);
    assert_eq!(messages(&b3).await, b1_all);
    let branches_of = async |parent: &str| -> Vec<(String, u64)> {
        let filter = SessionFilter {
            parent: Some(parent.to_owned()),
            ..SessionFilter::default()
        };
        let mut found: Vec<_> = store
            .list(&filter)
            .await
            .unwrap()
            .into_iter()
            .map(|info| (info.record.id, info.messages))
            .collect();
        found.sort();
        found
    };
    assert_eq!(branches_of(&root).await, [(b1.clone(), 3)]);
    assert_eq!(branches_of(&b1).await, [(b2.clone(), 1), (b3.clone(), 3)]);

    // Refused, with nothing written.
    let refused = |batch| async { writer.write(batch).await.unwrap_err() };
    assert_eq!(
        refused(vec![fork(&id("past"), &root, 7)]).await,
        StoreError::ForkPastEnd {
            session: root.clone(),
            at: 7,
            messages: 6
        }
    );
    assert_eq!(
        refused(vec![fork(&id("orphan"), &id("nowhere"), 0)]).await,
        StoreError::NoSuchSession(id("nowhere"))
    );
    assert_eq!(
        refused(vec![fork(&b2, &root, 1)]).await,
        StoreError::SessionExists(b2.clone())
    );
    assert_eq!(store.load(&id("past")).await.unwrap(), None);
    // Past the end the batch leaves, though not past the one before it.
    assert_eq!(
        refused(vec![
            write(&root, Change::Truncate { from: 1 }),
            fork(&id("past"), &root, 3)
        ])
        .await,
        StoreError::ForkPastEnd {
            session: root.clone(),
            at: 3,
            messages: 1
        }
    );
    assert_eq!(messages(&root).await, all);

    // The root cut, then gone: its branches read what they read.
    writer
        .write(vec![write(&root, Change::Truncate { from: 1 })])
        .await
        .unwrap();
    assert_eq!(messages(&root).await, all[..1]);
    assert_eq!(messages(&b1).await, b1_all);
    assert!(store.delete(&root).await.unwrap());
    assert_eq!(messages(&b1).await, b1_all);
    assert_eq!(messages(&b2).await, all[..1]);
    assert_eq!(messages(&b3).await, b1_all);
    // A branch cut within what it shares reads less of it, and goes on.
    writer
        .write(vec![
            write(&b3, Change::Truncate { from: 1 }),
            append(&b3, 1, &own),
        ])
        .await
        .unwrap();
    assert_eq!(messages(&b3).await, [all[0].clone(), own.clone()]);
    assert!(store.delete(&b1).await.unwrap());
    assert_eq!(messages(&b3).await, [all[0].clone(), own.clone()]);
    assert_eq!(messages(&b2).await, all[..1]);
    for branch in [&b2, &b3] {
        assert!(store.delete(branch).await.unwrap());
    }
    assert_eq!(store.load(&b3).await.unwrap(), None);
}

/// A user's memory is theirs alone (not another user's, not the same user's of
/// another tenant), found by its words whatever the query holds, bounded, and
/// forgotten on request.
async fn recalls_facts_by_what_they_mean(store: Arc<dyn SessionStore>, tenant: &str) {
    let ada = MemoryOwner::new(tenant, "vector-ada");
    let embedding = |model: &str, vector: &[f32]| Embedding::new(model, vector.to_vec()).unwrap();
    let texts = |found: Vec<Memory>| found.into_iter().map(|fact| fact.text).collect::<Vec<_>>();
    for (text, vector) in [
        ("likes cats", [1.0, 0.1, 0.0]),
        ("likes dogs", [0.8, 0.6, 0.0]),
        ("lives in Oslo", [0.0, 0.0, 1.0]),
    ] {
        store
            .remember(&ada, text, Some(&embedding("m", &vector)))
            .await
            .unwrap();
    }
    // Not compared: another model's vector, one of other dimensions, none.
    store
        .remember(
            &ada,
            "another model's",
            Some(&embedding("other", &[1.0, 0.0, 0.0])),
        )
        .await
        .unwrap();
    store
        .remember(&ada, "two dimensions", Some(&embedding("m", &[1.0, 0.0])))
        .await
        .unwrap();
    store.remember(&ada, "no vector", None).await.unwrap();
    let query = embedding("m", &[1.0, 0.0, 0.0]);
    assert_eq!(
        texts(store.recall_similar(&ada, &query, 5).await.unwrap()),
        ["likes cats", "likes dogs", "lives in Oslo"]
    );
    assert_eq!(
        texts(store.recall_similar(&ada, &query, 1).await.unwrap()),
        ["likes cats"]
    );
    let somewhere = embedding("m", &[0.0, 0.1, 1.0]);
    assert_eq!(
        texts(store.recall_similar(&ada, &somewhere, 1).await.unwrap()),
        ["lives in Oslo"]
    );
    let bob = MemoryOwner::new(tenant, "vector-bob");
    assert_eq!(store.recall_similar(&bob, &query, 5).await, Ok(vec![]));
    // Forgotten facts are not found.
    let cats = store.memories(&ada, 0, 1).await.unwrap().remove(0);
    assert_eq!(store.forget(&ada, Some(&cats.id)).await, Ok(1));
    assert_eq!(
        texts(store.recall_similar(&ada, &query, 1).await.unwrap()),
        ["likes dogs"]
    );
    assert_eq!(store.forget(&ada, None).await, Ok(5));
}

async fn keeps_each_users_memory_apart(store: Arc<dyn SessionStore>, tenant: &str) {
    let ada = MemoryOwner::new(tenant, "ada");
    let bob = MemoryOwner::new(tenant, "bob");
    let other_ada = MemoryOwner::new(format!("{tenant}-other"), "ada");
    assert_eq!(store.working_memory(&ada).await, Ok(None));
    store.set_working_memory(&ada, "Name: Ada").await.unwrap();
    store
        .set_working_memory(&ada, "Name: Ada\nTea: green")
        .await
        .unwrap();
    assert_eq!(
        store.working_memory(&ada).await,
        Ok(Some("Name: Ada\nTea: green".to_owned()))
    );
    assert_eq!(store.working_memory(&bob).await, Ok(None));
    assert_eq!(
        store
            .set_working_memory(&ada, &"x".repeat(MAX_WORKING_MEMORY_BYTES + 1))
            .await,
        Err(StoreError::MemoryTooLarge {
            bytes: MAX_WORKING_MEMORY_BYTES + 1,
            limit: MAX_WORKING_MEMORY_BYTES
        })
    );

    let name = store
        .remember(&ada, "The user's name is Ada Lovelace", None)
        .await
        .unwrap();
    let tea = store
        .remember(&ada, "Ada drinks green tea", None)
        .await
        .unwrap();
    let _ = store
        .remember(&ada, "Prefers short answers", None)
        .await
        .unwrap();
    store
        .remember(&bob, "The user's name is Bob", None)
        .await
        .unwrap();
    store
        .remember(&other_ada, "This Ada's name is secret", None)
        .await
        .unwrap();
    assert_eq!(
        store.remember(&ada, "  ", None).await,
        Err(StoreError::EmptyMemory)
    );

    let texts = |memories: Vec<Memory>| memories.into_iter().map(|m| m.text).collect::<Vec<_>>();
    // "names" finds "name" (stemmed), and the fact with more of the words ranks first.
    assert_eq!(
        texts(store.recall(&ada, "names? Lovelace", 5).await.unwrap()),
        ["The user's name is Ada Lovelace"]
    );
    assert_eq!(
        texts(store.recall(&ada, "tea \"OR\" * name)", 1).await.unwrap()).len(),
        1
    );
    let mut found = texts(store.recall(&ada, "tea name", 5).await.unwrap());
    found.sort();
    assert_eq!(
        found,
        ["Ada drinks green tea", "The user's name is Ada Lovelace"]
    );
    assert_eq!(
        texts(store.recall(&bob, "name", 5).await.unwrap()),
        ["The user's name is Bob"]
    );
    assert!(store.recall(&ada, " ?* ", 5).await.unwrap().is_empty());
    assert!(store.recall(&ada, "coffee", 5).await.unwrap().is_empty());

    assert_eq!(
        store.memories(&ada, 0, 10).await.unwrap(),
        vec![
            name.clone(),
            tea.clone(),
            store.memories(&ada, 2, 1).await.unwrap()[0].clone()
        ]
    );
    assert_eq!(store.memories(&ada, 1, 1).await.unwrap(), vec![tea.clone()]);

    // Bob cannot forget Ada's fact by its id.
    assert_eq!(store.forget(&bob, Some(&tea.id)).await, Ok(0));
    assert_eq!(store.forget(&ada, Some(&tea.id)).await, Ok(1));
    assert!(store.recall(&ada, "tea", 5).await.unwrap().is_empty());
    assert_eq!(store.forget(&ada, None).await, Ok(2));
    assert_eq!(store.working_memory(&ada).await, Ok(None));
    assert!(store.memories(&ada, 0, 10).await.unwrap().is_empty());
    assert_eq!(store.memories(&bob, 0, 10).await.unwrap().len(), 1);
    assert_eq!(store.memories(&other_ada, 0, 10).await.unwrap().len(), 1);
}

/// A schedule's slot is claimed once, by whichever caller comes first, however
/// many race for it; an earlier slot than the latest is never claimed again.
async fn claims_each_slot_of_a_schedule_once(store: Arc<dyn SessionStore>, tenant: &str) {
    let schedule = format!("schedule.{tenant}.0");
    let racing: Vec<_> = (0..8)
        .map(|_| {
            let (store, schedule) = (store.clone(), schedule.clone());
            tokio::spawn(async move { store.claim_slot(&schedule, 60_000).await.unwrap() })
        })
        .collect();
    let mut won = 0;
    for claim in racing {
        won += usize::from(claim.await.unwrap());
    }
    assert_eq!(won, 1);
    assert_eq!(store.claim_slot(&schedule, 60_000).await, Ok(false));
    assert_eq!(store.claim_slot(&schedule, 0).await, Ok(false));
    assert_eq!(store.claim_slot(&schedule, 120_000).await, Ok(true));
    let other = format!("schedule.{tenant}.1");
    assert_eq!(store.claim_slot(&other, 60_000).await, Ok(true));
}

/// A message carrying `file`, with a fixed timestamp.
fn with_file(text: &str, file: &FileContent) -> AgentMessage {
    let mut message = tiller_ai::UserMessage::text(text).with_file(file.clone());
    message.timestamp = 1_700_000_000_000;
    message.into()
}

async fn keeps_files_once_and_each_tenants_apart(store: Arc<dyn SessionStore>, tenant: &str) {
    let pdf = FileContent::from_bytes("report.pdf", b"%PDF-1.4 the report").unwrap();
    let id = file_id(b"%PDF-1.4 the report");
    let stored = store.put_file(tenant, &pdf).await.unwrap();
    assert_eq!(
        (
            stored.id.as_str(),
            stored.name.as_str(),
            stored.mime_type.as_str(),
            stored.size
        ),
        (id.as_str(), "report.pdf", "application/pdf", 19)
    );
    // The same bytes again: one file, the same id and age, the new name.
    let renamed = FileContent::from_bytes("renamed.pdf", b"%PDF-1.4 the report").unwrap();
    let again = store.put_file(tenant, &renamed).await.unwrap();
    assert_eq!(
        (again.id.as_str(), again.created_at),
        (id.as_str(), stored.created_at)
    );
    assert_eq!(store.file(tenant, &id).await, Ok(Some(renamed.clone())));
    let other = format!("{tenant}-other");
    assert_eq!(store.file(&other, &id).await, Ok(None));
    assert_eq!(store.delete_file(&other, &id).await, Ok(false));
    let bad = FileContent {
        data: "not base64!".to_owned(),
        ..pdf.clone()
    };
    assert!(matches!(
        store.put_file(tenant, &bad).await,
        Err(StoreError::InvalidFile(_))
    ));

    // Two sessions carry it, one in a queued message: each loads it whole.
    let writer = StoreWriter::for_store(store.clone());
    let (first, second) = (format!("{tenant}-files-1"), format!("{tenant}-files-2"));
    let asked = Arc::new(with_file("what does it say?", &pdf));
    let queued = with_file("and this one?", &renamed);
    writer
        .write(vec![
            write(&first, Change::Create(record(&first, &other, "ada"))),
            append(&first, 0, &asked),
            append(&first, 1, &Arc::new(user("plain"))),
            write(&second, Change::Create(record(&second, &other, "ada"))),
            append(&second, 0, &asked),
            write(
                &second,
                Change::Enqueue {
                    queue: QueueKind::FollowUp,
                    seq: 0,
                    message: queued.clone(),
                },
            ),
        ])
        .await
        .unwrap();
    for session in [&first, &second] {
        let loaded = store.load(session).await.unwrap().unwrap();
        assert_eq!(loaded.messages[0], asked);
    }
    let loaded = store.load(&second).await.unwrap().unwrap();
    assert_eq!(
        loaded.follow_up,
        vec![Queued {
            seq: 0,
            message: queued
        }]
    );
    assert_eq!(
        store.messages(&first, 0, 1).await.unwrap(),
        vec![asked.clone()]
    );

    // Forgetting the upload leaves the transcripts whole.
    assert_eq!(store.delete_file(tenant, &id).await, Ok(true));
    assert_eq!(store.file(tenant, &id).await, Ok(None));
    assert_eq!(store.delete_file(tenant, &id).await, Ok(false));
    let loaded = store.load(&first).await.unwrap().unwrap();
    assert_eq!(loaded.messages[0], asked);
}

async fn suite(store: Arc<dyn SessionStore>, tenant: &str) {
    keeps_files_once_and_each_tenants_apart(store.clone(), tenant).await;
    recalls_facts_by_what_they_mean(store.clone(), tenant).await;
    claims_each_slot_of_a_schedule_once(store.clone(), tenant).await;
    keeps_each_users_memory_apart(store.clone(), tenant).await;
    branches_share_their_prefix_and_outlive_it(store.clone(), tenant).await;
    keeps_origins_and_idempotency_keys(store.clone(), tenant).await;
    deletes_sub_sessions_and_prunes_closed_ones(store.clone(), tenant).await;
    a_claim_fences_the_writer_before(store.clone(), tenant).await;
    keeps_messages_queues_and_definition(store.clone(), tenant).await;
    pages_and_cuts_a_transcript_anywhere(store.clone(), tenant).await;
    a_failed_batch_changes_nothing(store.clone(), tenant).await;
    lists_by_owner_and_status(store.clone(), tenant).await;
    groups_many_writers_in_order(store, tenant).await;
}

#[tokio::test]
async fn memory_store() {
    suite(Arc::new(MemoryStore::new()), &tenant("memory")).await;
}

/// The in-memory store applies writes at once: a request is committed and
/// acknowledged before `submit` returns, with no turn of the writer's task, and
/// a refused one is answered with its own error the same way.
#[tokio::test]
async fn the_memory_stores_writer_acknowledges_before_submit_returns() {
    let store = Arc::new(MemoryStore::new());
    let writer = StoreWriter::for_store(store.clone());
    let heard = Arc::new(std::sync::Mutex::new(Vec::new()));
    let ack = |heard: &Arc<std::sync::Mutex<Vec<Result<(), StoreError>>>>| {
        let heard = heard.clone();
        let ack: tiller_store::Ack = Box::new(move |result| heard.lock().unwrap().push(result));
        Some(ack)
    };
    writer.submit(
        vec![write(
            "at-once",
            Change::Create(SessionRecord::new("at-once")),
        )],
        ack(&heard),
    );
    writer.submit(
        vec![append("at-once", 0, &Arc::new(user("hello")))],
        ack(&heard),
    );
    writer.submit(
        vec![append("never-made", 0, &Arc::new(user("lost")))],
        ack(&heard),
    );
    let heard = std::mem::take(&mut *heard.lock().unwrap());
    assert_eq!(heard.len(), 3);
    assert!(heard[0].is_ok() && heard[1].is_ok());
    assert!(
        matches!(&heard[2], Err(StoreError::NoSuchSession(session)) if session == "never-made"),
        "{:?}",
        heard[2]
    );
    let stored = store.load("at-once").await.unwrap().unwrap();
    assert_eq!(stored.messages.len(), 1);
}

#[tokio::test]
async fn sqlite_store() {
    let db = TempSqlite::new();
    let url = db.url().to_owned();
    suite(
        Arc::new(SqlStore::open(&url).await.unwrap()),
        &tenant("sqlite"),
    )
    .await;
}

#[tokio::test]
async fn postgres_store() {
    let Some(url) = tiller_test_support::postgres::postgres_url() else {
        return;
    };
    suite(
        Arc::new(SqlStore::open(&url).await.unwrap()),
        &tenant("postgres"),
    )
    .await;
}

/// An SQL store reads a branch of a branch (and so on) through at most
/// [`MAX_BRANCH_DEPTH`] sessions: past it a fork is refused, while one within
/// what the deepest branch shares is not.
#[tokio::test]
async fn sqlite_forks_a_branch_at_most_its_depth_deep() {
    let db = TempSqlite::new();
    let store: Arc<dyn SessionStore> = Arc::new(SqlStore::open(db.url()).await.unwrap());
    let writer = StoreWriter::for_store(store.clone());
    let said: Vec<Arc<AgentMessage>> = (0..=MAX_BRANCH_DEPTH)
        .map(|n| Arc::new(user(format!("m{n}"))))
        .collect();
    writer
        .write(vec![
            write("b0", Change::Create(SessionRecord::new("b0"))),
            append("b0", 0, &said[0]),
        ])
        .await
        .unwrap();
    let fork =
        |branch: &str, parent: &str, at: u64| fork(branch, parent, at, SessionRecord::new(branch));
    for (n, message) in said.iter().enumerate().take(MAX_BRANCH_DEPTH).skip(1) {
        let (branch, parent) = (format!("b{n}"), format!("b{}", n - 1));
        writer
            .write(vec![
                fork(&branch, &parent, n as u64),
                append(&branch, n as u64, message),
            ])
            .await
            .unwrap();
    }
    let deepest = format!("b{}", MAX_BRANCH_DEPTH - 1);
    assert_eq!(
        store.load(&deepest).await.unwrap().unwrap().messages,
        said[..MAX_BRANCH_DEPTH]
    );
    assert_eq!(
        writer
            .write(vec![fork("too-deep", &deepest, MAX_BRANCH_DEPTH as u64)])
            .await
            .unwrap_err(),
        StoreError::BranchTooDeep {
            session: deepest.clone(),
            depth: MAX_BRANCH_DEPTH
        }
    );
    writer
        .write(vec![fork("shallow", &deepest, 1)])
        .await
        .unwrap();
    assert_eq!(
        store.load("shallow").await.unwrap().unwrap().messages,
        said[..1]
    );
}

/// What is written survives closing and reopening the file; opening migrates once.
#[tokio::test]
async fn sqlite_keeps_sessions_across_opens() {
    let db = TempSqlite::new();
    let url = db.url().to_owned();
    let store = SqlStore::open(&url).await.unwrap();
    let writer = StoreWriter::new(store.clone());
    writer
        .write(vec![
            write("kept", Change::Create(record("kept", "t", "ada"))),
            write(
                "kept",
                Change::Append {
                    seq: 0,
                    message: user("still here").into(),
                    dequeued: None,
                },
            ),
        ])
        .await
        .unwrap();
    drop(writer);
    drop(store);
    let reopened = SqlStore::open(&url).await.unwrap();
    let loaded = reopened.load("kept").await.unwrap().unwrap();
    assert_eq!(loaded.messages, vec![user("still here").into()]);
}

/// A tenant stores at most [`MAX_UPLOADS`] files on their own; the same bytes
/// again, or another tenant's, are not counted against it.
#[tokio::test]
async fn a_tenant_stores_at_most_its_bound_of_files() {
    let store = MemoryStore::new();
    for n in 0..tiller_store::MAX_UPLOADS {
        let file = FileContent::from_bytes("n.txt", n.to_string().as_bytes()).unwrap();
        store.put_file("t", &file).await.unwrap();
    }
    let last = FileContent::from_bytes("n.txt", b"one more").unwrap();
    assert_eq!(
        store.put_file("t", &last).await,
        Err(StoreError::TooManyFiles {
            limit: tiller_store::MAX_UPLOADS
        })
    );
    let again = FileContent::from_bytes("n.txt", b"0").unwrap();
    assert!(store.put_file("t", &again).await.is_ok());
    assert!(store.put_file("u", &last).await.is_ok());
}

/// A file's bytes are kept once in the store however many sessions carry it,
/// the messages' rows name it, and pruning drops it once nothing names it.
#[tokio::test]
async fn sqlite_keeps_a_files_bytes_once_and_prunes_them_when_unnamed() {
    use sqlx::Connection;
    let db = TempSqlite::new();
    let store = SqlStore::open(db.url()).await.unwrap();
    let pdf = FileContent::from_bytes("report.pdf", &[b'%'; 3000]).unwrap();
    let asked = Arc::new(with_file("read it", &pdf));
    let mut batch = Vec::new();
    for session in ["a", "b", "c"] {
        batch.push(write(session, Change::Create(record(session, "t", "ada"))));
        batch.push(append(session, 0, &asked));
    }
    StoreWriter::new(store.clone()).write(batch).await.unwrap();
    store.put_file("t", &pdf).await.unwrap();
    let mut connection = sqlx::SqliteConnection::connect(db.url()).await.unwrap();
    let count = async |connection: &mut sqlx::SqliteConnection, sql: &str| -> i64 {
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
            .fetch_one(connection)
            .await
            .unwrap()
    };
    assert_eq!(
        count(&mut connection, "SELECT count(*) FROM tiller_files").await,
        1
    );
    assert_eq!(
        count(
            &mut connection,
            "SELECT sum(length(message)) < 1000 FROM tiller_messages"
        )
        .await,
        1,
        "the rows name the file and hold no copy of it"
    );
    for session in ["a", "b", "c"] {
        assert_eq!(
            store.load(session).await.unwrap().unwrap().messages,
            vec![asked.clone()]
        );
    }
    // Named by an upload or a message, it stays; then it goes.
    sqlx::query("UPDATE tiller_sessions SET status = 'closed'")
        .execute(&mut connection)
        .await
        .unwrap();
    store.prune(i64::MAX).await.unwrap();
    assert_eq!(
        count(&mut connection, "SELECT count(*) FROM tiller_files").await,
        1
    );
    assert!(
        store
            .delete_file("t", &file_id(&[b'%'; 3000]))
            .await
            .unwrap()
    );
    store.prune(i64::MAX).await.unwrap();
    assert_eq!(
        count(&mut connection, "SELECT count(*) FROM tiller_files").await,
        0
    );
}

/// A file of schema version 1 (a row per message) is migrated when it opens:
/// its sessions load, page and take new messages as before.
#[tokio::test]
async fn sqlite_migrates_a_file_of_version_1() {
    use sqlx::Connection;
    let db = TempSqlite::new();
    let mut connection = sqlx::SqliteConnection::connect(&format!("{}?mode=rwc", db.url()))
        .await
        .unwrap();
    let (hello, there) = (Arc::new(user("hello")), Arc::new(user("there")));
    for statement in [
        "CREATE TABLE tiller_schema (version BIGINT NOT NULL)".to_owned(),
        "INSERT INTO tiller_schema (version) VALUES (1)".to_owned(),
        "CREATE TABLE tiller_sessions (id TEXT PRIMARY KEY, tenant_id TEXT, user_id TEXT, \
         name TEXT, definition TEXT NOT NULL, status TEXT NOT NULL, \
         created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL)"
            .to_owned(),
        "CREATE INDEX tiller_sessions_owner ON tiller_sessions (tenant_id, user_id, updated_at)"
            .to_owned(),
        "CREATE TABLE tiller_messages (session_id TEXT NOT NULL, seq BIGINT NOT NULL, \
         message TEXT NOT NULL, PRIMARY KEY (session_id, seq)) WITHOUT ROWID"
            .to_owned(),
        "CREATE TABLE tiller_queued (session_id TEXT NOT NULL, seq BIGINT NOT NULL, \
         queue TEXT NOT NULL, message TEXT NOT NULL, PRIMARY KEY (session_id, seq)) WITHOUT ROWID"
            .to_owned(),
        "INSERT INTO tiller_sessions VALUES ('old', NULL, NULL, NULL, 'null', 'active', 1, 1)"
            .to_owned(),
        format!(
            "INSERT INTO tiller_messages VALUES ('old', 0, '{}'), ('old', 1, '{}')",
            serde_json::to_string(&*hello).unwrap(),
            serde_json::to_string(&*there).unwrap()
        ),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .execute(&mut connection)
            .await
            .unwrap();
    }
    connection.close().await.unwrap();

    let store = SqlStore::open(db.url()).await.unwrap();
    let again = Arc::new(user("again"));
    StoreWriter::new(store.clone())
        .write(vec![append("old", 2, &again)])
        .await
        .unwrap();
    let all = vec![hello, there, again];
    assert_eq!(store.load("old").await.unwrap().unwrap().messages, all);
    assert_eq!(store.messages("old", 1, 5).await.unwrap(), all[1..]);
    let listed = store.list(&SessionFilter::default()).await.unwrap();
    assert_eq!(listed[0].messages, 3);
}

#[tokio::test]
async fn bad_urls_say_what_is_expected() {
    let Err(error) = tiller_store::open("mysql://root:hunter2@db/x").await else {
        panic!("mysql is not supported");
    };
    assert_eq!(
        error,
        StoreError::UnsupportedUrl {
            url: "mysql://root@db/x".to_owned(),
            reason: "expected memory:, sqlite://PATH or postgres://…".to_owned(),
        }
    );
    let Err(StoreError::Database(message)) =
        tiller_store::open("postgres://tiller:hunter2@127.0.0.1:1/db").await
    else {
        panic!("a closed port is a database error");
    };
    assert!(!message.contains("hunter2"), "{message}");
    assert!(
        message.starts_with("cannot open postgres://tiller@127.0.0.1:1/db: "),
        "{message}"
    );
}

/// A file that is not a database is refused at once with an error that says so;
/// another program's database is left as it was (no migration, no WAL).
#[tokio::test]
async fn a_file_not_tillers_is_refused_at_once_and_left_alone() {
    use sqlx::Connection;
    let garbage = TempSqlite::new();
    let path = garbage.url().strip_prefix("sqlite://").unwrap().to_owned();
    std::fs::write(&path, "name,amount\nada,12\n".repeat(400)).unwrap();
    assert_eq!(
        SqlStore::open(garbage.url()).await.unwrap_err(),
        StoreError::NotADatabase {
            url: garbage.url().to_owned()
        }
    );

    let foreign = TempSqlite::new();
    let mut connection = sqlx::SqliteConnection::connect(&format!("{}?mode=rwc", foreign.url()))
        .await
        .unwrap();
    sqlx::query("CREATE TABLE orders (id INTEGER PRIMARY KEY, amount INTEGER)")
        .execute(&mut connection)
        .await
        .unwrap();
    connection.close().await.unwrap();
    let path = foreign.url().strip_prefix("sqlite://").unwrap().to_owned();
    let before = std::fs::read(&path).unwrap();
    assert_eq!(
        SqlStore::open(foreign.url()).await.unwrap_err(),
        StoreError::ForeignDatabase {
            url: foreign.url().to_owned(),
            detail: "application id 0x0, tables orders".to_owned(),
        }
    );
    assert_eq!(
        std::fs::read(&path).unwrap(),
        before,
        "the file is untouched"
    );
    assert!(!std::path::Path::new(&format!("{path}-wal")).exists());

    // Tiller's own file opens again, marked as Tiller's.
    let ours = TempSqlite::new();
    drop(SqlStore::open(ours.url()).await.unwrap());
    SqlStore::open(ours.url()).await.unwrap();
}

/// A session whose row cannot be read is left out of a list, with the others in it.
#[tokio::test]
async fn one_unreadable_session_leaves_the_rest_of_the_list() {
    use sqlx::Connection;
    let db = TempSqlite::new();
    let store = SqlStore::open(db.url()).await.unwrap();
    StoreWriter::new(store.clone())
        .write(vec![
            write("good", Change::Create(record("good", "t", "ada"))),
            write("bad", Change::Create(record("bad", "t", "ada"))),
        ])
        .await
        .unwrap();
    let mut connection = sqlx::SqliteConnection::connect(db.url()).await.unwrap();
    sqlx::query("UPDATE tiller_sessions SET status = 'lost' WHERE id = 'bad'")
        .execute(&mut connection)
        .await
        .unwrap();
    let listed: Vec<String> = store
        .list(&SessionFilter::default())
        .await
        .unwrap()
        .into_iter()
        .map(|info| info.record.id)
        .collect();
    assert_eq!(listed, ["good"]);
}

/// A row the store did not write as it is (edited by hand, cut short) fails its
/// load with the session and what in it is wrong, rather than passing it on.
#[tokio::test]
async fn a_corrupt_row_names_its_session() {
    use sqlx::Connection;
    let db = TempSqlite::new();
    let store = SqlStore::open(db.url()).await.unwrap();
    StoreWriter::new(store.clone())
        .write(vec![
            write("cut", Change::Create(record("cut", "t", "ada"))),
            append("cut", 0, &Arc::new(user("one"))),
            append("cut", 1, &Arc::new(user("two"))),
        ])
        .await
        .unwrap();
    let mut connection = sqlx::SqliteConnection::connect(db.url()).await.unwrap();
    for edit in [
        "UPDATE tiller_sessions SET definition = '{\"model\": ' WHERE id = 'cut'",
        "UPDATE tiller_messages SET message_count = 3 WHERE session_id = 'cut'",
    ] {
        sqlx::query(edit).execute(&mut connection).await.unwrap();
    }
    let corrupt = |detail: &str| StoreError::Corrupt {
        session: "cut".to_owned(),
        detail: detail.to_owned(),
    };
    assert_eq!(
        store.load("cut").await.unwrap_err(),
        corrupt("its definition: EOF while parsing a value at line 1 column 10")
    );
    assert_eq!(
        store.messages("cut", 1, 10).await.unwrap_err(),
        corrupt("a row of 3 messages holds 2")
    );
}

/// Many small writes to many sessions, read all the while: each commit writes
/// whole pages to the WAL (far more than the JSON it stores), and readers always
/// hold a snapshot, yet the WAL stays near its 64 MiB bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_writes_to_many_sessions_read_all_the_while_keep_the_wal_bounded() {
    const SESSIONS: usize = 300;
    const WRITES: u64 = 4_000;
    let db = TempSqlite::new();
    let store = SqlStore::open(db.url()).await.unwrap();
    let writer = StoreWriter::new(store.clone());
    let names: Vec<String> = (0..SESSIONS).map(|n| format!("s{n}")).collect();
    writer
        .write(
            names
                .iter()
                .map(|name| write(name, Change::Create(record(name, "t", "ada"))))
                .collect(),
        )
        .await
        .unwrap();
    let wal = std::path::PathBuf::from(format!(
        "{}-wal",
        db.url().strip_prefix("sqlite://").unwrap()
    ));
    let reading = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let reader = {
        let (store, reading) = (store.clone(), reading.clone());
        tokio::spawn(async move {
            let mut reads = 0u64;
            while reading.load(std::sync::atomic::Ordering::Acquire) {
                store.list(&SessionFilter::default()).await.unwrap();
                reads += 1;
            }
            reads
        })
    };
    let mut largest_wal = 0;
    for n in 0..WRITES {
        let name = &names[n as usize % SESSIONS];
        writer
            .write(vec![write(
                name,
                Change::Append {
                    seq: n / SESSIONS as u64,
                    message: user(format!("message {n}")).into(),
                    dequeued: None,
                },
            )])
            .await
            .unwrap();
        largest_wal = largest_wal.max(std::fs::metadata(&wal).map_or(0, |file| file.len()));
    }
    reading.store(false, std::sync::atomic::Ordering::Release);
    assert!(
        reader.await.unwrap() > 0,
        "the sessions were read meanwhile"
    );
    assert!(
        largest_wal < 80 << 20,
        "the WAL grew to {largest_wal} bytes over {WRITES} small writes"
    );
    let loaded = store.load("s0").await.unwrap().unwrap();
    assert_eq!(
        loaded.messages.len() as u64,
        WRITES.div_ceil(SESSIONS as u64)
    );
}

/// A steady stream of writes, which checkpoints run beside the writes never catch
/// up with, still lets SQLite's WAL start over: it stays near its 64 MiB bound
/// instead of growing with everything written. `SqlStore::checkpoint` empties it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steady_stream_of_writes_keeps_the_wal_bounded() {
    use futures::StreamExt;
    const MESSAGES: u64 = 800;
    const MESSAGE_BYTES: usize = 256 << 10;
    let db = TempSqlite::new();
    let store = SqlStore::open(db.url()).await.unwrap();
    let writer = StoreWriter::new(store.clone());
    writer
        .write(vec![write(
            "long",
            Change::Create(record("long", "t", "ada")),
        )])
        .await
        .unwrap();
    let wal = std::path::PathBuf::from(format!(
        "{}-wal",
        db.url().strip_prefix("sqlite://").unwrap()
    ));
    let text = "x".repeat(MESSAGE_BYTES);
    // Eight writes in flight at all times: the writer is never idle.
    let mut writes = futures::stream::iter(0..MESSAGES)
        .map(|seq| {
            writer.write(vec![write(
                "long",
                Change::Append {
                    seq,
                    message: user(text.clone()).into(),
                    dequeued: None,
                },
            )])
        })
        .buffer_unordered(8);
    let mut largest_wal = 0;
    while let Some(written) = writes.next().await {
        written.unwrap();
        largest_wal = largest_wal.max(std::fs::metadata(&wal).map_or(0, |file| file.len()));
    }
    let written = MESSAGES * MESSAGE_BYTES as u64;
    assert!(
        largest_wal < 128 << 20,
        "the WAL grew to {largest_wal} bytes, of {written} written"
    );
    let loaded = store.load("long").await.unwrap().unwrap();
    assert_eq!(loaded.messages.len() as u64, MESSAGES);
    // A checkpoint asked for copies the rest and empties the WAL.
    store.checkpoint().await.unwrap();
    assert_eq!(std::fs::metadata(&wal).unwrap().len(), 0);
    let reloaded = store.load("long").await.unwrap().unwrap();
    assert_eq!(reloaded.messages.len() as u64, MESSAGES);
}

/// Two processes' stores on one PostgreSQL, twenty calls at once against a
/// budget of five: five held, whatever the interleaving; settling writes what
/// was used, freeing the rest; SQLite and memory keep no shared ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_holds_on_one_postgresql_never_pass_its_budget() {
    use tiller_core::{Budget, Reserved, Spent, TenantLedger};
    let temp = TempSqlite::new();
    assert!(
        Arc::new(SqlStore::open(temp.url()).await.unwrap())
            .ledger()
            .is_none()
    );
    assert!(Arc::new(MemoryStore::new()).ledger().is_none());
    let Some(url) = tiller_test_support::postgres::postgres_url() else {
        return;
    };
    let tenant = tenant("ledger");
    let stores: Vec<Arc<dyn TenantLedger>> = vec![
        Arc::new(SqlStore::open(&url).await.unwrap())
            .ledger()
            .unwrap(),
        Arc::new(SqlStore::open(&url).await.unwrap())
            .ledger()
            .unwrap(),
    ];
    let budget = Budget {
        model_calls: Some(5),
        ..Budget::default()
    };
    let prices = tiller_ai::ModelCost::default();
    let calls = (0..20).map(|n| {
        let (ledger, budget, prices, tenant) = (&stores[n % 2], &budget, &prices, &tenant);
        async move {
            ledger
                .reserve(tenant, budget, 100, 50, prices)
                .await
                .unwrap()
        }
    });
    let reserved = futures::future::join_all(calls).await;
    let held: Vec<(String, Spent)> = reserved
        .iter()
        .filter_map(|reserved| match reserved {
            Reserved::Held { id, hold, .. } => Some((id.clone(), *hold)),
            Reserved::Refused(..) => None,
        })
        .collect();
    assert_eq!(held.len(), 5, "{reserved:?}");
    assert!(
        held.iter()
            .all(|(_, hold)| hold.model_calls == 1 && hold.output_tokens == 50)
    );
    // Settled with what each used: the spending row has it, and the budget is
    // still spent.
    let used = Spent {
        input_tokens: 100,
        output_tokens: 10,
        model_calls: 1,
        ..Spent::default()
    };
    for (n, (id, _)) in held.iter().enumerate() {
        stores[n % 2].settle(&tenant, id, &used).await.unwrap();
    }
    // A settlement tried again (its first reply lost) is not counted twice;
    // nor is an addition.
    stores[1].settle(&tenant, &held[0].0, &used).await.unwrap();
    let tools = Spent::tool_calls(2);
    stores[0].add(&tenant, "add-1", &tools).await.unwrap();
    stores[1].add(&tenant, "add-1", &tools).await.unwrap();
    let store = SqlStore::open(&url).await.unwrap();
    let spent = store
        .spent(&tiller_store::SpendScope::Tenant(tenant.clone()))
        .await
        .unwrap();
    assert_eq!(
        (spent.model_calls, spent.output_tokens, spent.tool_calls),
        (5, 50, 2)
    );
    assert!(matches!(
        stores[0]
            .reserve(&tenant, &budget, 100, 50, &prices)
            .await
            .unwrap(),
        Reserved::Refused(tiller_core::budget::BudgetLimit::ModelCalls, ..)
    ));
    // A larger budget: the room left, one call at a time.
    let more = Budget {
        model_calls: Some(6),
        ..Budget::default()
    };
    let Reserved::Held { spent, .. } = stores[1]
        .reserve(&tenant, &more, 100, 50, &prices)
        .await
        .unwrap()
    else {
        panic!("the sixth call had room");
    };
    assert_eq!(spent.model_calls, 5);
}
