//! Reading back what the cluster published, for an audit (the chaos tests'
//! invariant checker uses it): an agent's batches of events as JetStream keeps
//! them, in order, each with the epoch of the owner that published it.

use std::time::Duration;

use async_nats::jetstream::consumer::DeliverPolicy;
use async_nats::jetstream::consumer::pull::OrderedConfig;
use futures::StreamExt;

use crate::config::ClusterConfig;
use crate::error::ClusterError;
use crate::names::{EVENTS, EventSubject, stamp_of};

/// How long the audit waits for the stream's next batch (an election).
const READ_WAIT: Duration = Duration::from_secs(30);

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
/// the NATS servers of `config` with its credentials.
pub async fn published(
    config: &ClusterConfig,
    subject: &EventSubject,
) -> Result<Vec<PublishedBatch>, ClusterError> {
    let client = crate::connect::connect(config).await?;
    let js = async_nats::jetstream::new(client);
    // A node just lost leaves JetStream electing a while.
    let stream = crate::while_electing(|| js.get_stream(EVENTS)).await?;
    // The subject's last batch as the audit begins: read up to it.
    let name = subject.subject();
    let last = crate::while_electing(|| crate::last_message(&stream, &name)).await?;
    let Some(last) = last.map(|message| message.sequence) else {
        return Ok(Vec::new());
    };
    let consumer = crate::while_electing(|| {
        stream.create_consumer(OrderedConfig {
            filter_subject: name.clone(),
            deliver_policy: DeliverPolicy::All,
            ..OrderedConfig::default()
        })
    })
    .await?;
    let mut messages = consumer.messages().await.map_err(ClusterError::nats)?;
    let mut batches = Vec::new();
    loop {
        let message = match tokio::time::timeout(READ_WAIT, messages.next()).await {
            Ok(Some(message)) => message.map_err(ClusterError::nats)?,
            Ok(None) => return Err(ClusterError::Nats("the stream's consumer ended".to_owned())),
            Err(_) => {
                return Err(ClusterError::Nats(format!(
                    "the stream gave nothing for {READ_WAIT:?} before its batch {last}"
                )));
            }
        };
        let info = message.info().map_err(ClusterError::nats)?;
        let (epoch, first) = stamp_of(&message).unwrap_or_default();
        batches.push(PublishedBatch {
            stream_seq: info.stream_sequence,
            epoch,
            first,
            events: message
                .payload
                .split(|byte| *byte == b'\n')
                .filter_map(|line| serde_json::from_slice(line).ok())
                .collect(),
        });
        if info.stream_sequence >= last {
            return Ok(batches);
        }
    }
}
