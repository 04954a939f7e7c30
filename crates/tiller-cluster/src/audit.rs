//! Reading back what the cluster published, for an audit (the chaos tests'
//! invariant checker uses it): an agent's batches of events as JetStream keeps
//! them, in order, each with the epoch of the owner that published it.

use std::time::Duration;

use async_nats::jetstream::consumer::DeliverPolicy;
use async_nats::jetstream::consumer::pull::OrderedConfig;
use futures::StreamExt;

use crate::error::ClusterError;
use crate::names::{EPOCH_HEADER, EVENTS, EventSubject, FIRST_HEADER};

/// One batch of an agent's events as JetStream keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct PublishedBatch {
    /// Its place in the events stream.
    pub stream_seq: u64,
    /// The epoch of the owner that published it.
    pub epoch: u64,
    /// The number of its first event.
    pub first: u64,
    /// Its events' envelopes.
    pub events: Vec<serde_json::Value>,
}

/// Every batch JetStream keeps of `subject`'s events, oldest first, read from
/// the NATS servers `servers`.
pub async fn published(
    servers: &[String],
    subject: &EventSubject,
) -> Result<Vec<PublishedBatch>, ClusterError> {
    let client = async_nats::connect(servers)
        .await
        .map_err(ClusterError::nats)?;
    let js = async_nats::jetstream::new(client);
    // A node just lost leaves JetStream electing a while.
    let stream = crate::while_electing(|| js.get_stream(EVENTS)).await?;
    let consumer = crate::while_electing(|| {
        stream.create_consumer(OrderedConfig {
            filter_subject: subject.subject(),
            deliver_policy: DeliverPolicy::All,
            ..OrderedConfig::default()
        })
    })
    .await?;
    let mut messages = consumer.messages().await.map_err(ClusterError::nats)?;
    let mut batches = Vec::new();
    loop {
        // An empty subject delivers nothing: the wait has an end.
        let Ok(Some(message)) = tokio::time::timeout(Duration::from_secs(2), messages.next()).await
        else {
            return Ok(batches);
        };
        let message = message.map_err(ClusterError::nats)?;
        let info = message.info().map_err(ClusterError::nats)?;
        let header = |name: &str| {
            message
                .headers
                .as_ref()
                .and_then(|headers| headers.get(name))
                .and_then(|value| value.as_str().parse::<u64>().ok())
                .unwrap_or_default()
        };
        batches.push(PublishedBatch {
            stream_seq: info.stream_sequence,
            epoch: header(EPOCH_HEADER),
            first: header(FIRST_HEADER),
            events: message
                .payload
                .split(|byte| *byte == b'\n')
                .filter_map(|line| serde_json::from_slice(line).ok())
                .collect(),
        });
        if info.pending == 0 {
            return Ok(batches);
        }
    }
}
