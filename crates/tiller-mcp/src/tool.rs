//! [`McpTool`]: one tool of an MCP server as an agent tool. A call goes to the
//! server the client is connected to at that moment; the progress notifications
//! for its request become `tool_execution_update` events; an aborted run sends the
//! server MCP's cancellation for it. The result's text, images and
//! resources become the tool's output; a result marked as an error is the tool's
//! error.

use std::sync::Arc;

use futures::future::BoxFuture;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, CancelledNotificationParam,
    ClientRequest, ContentBlock, ResourceContents, ServerResult,
};
use rmcp::service::{PeerRequestOptions, ServiceError};
use serde_json::Value;
use tiller_ai::{Content, ImageContent};
use tiller_core::{AgentTool, ToolContext, ToolError, ToolOutput};

use crate::client::McpClient;

/// A tool of an MCP server. It keeps the connection up while it exists.
pub struct McpTool {
    pub(crate) client: McpClient,
    /// The server's name for it.
    pub(crate) remote: Arc<str>,
    /// The model's name for it (prefixed).
    pub(crate) name: String,
    pub(crate) description: String,
    pub(crate) parameters: Value,
}

impl AgentTool for McpTool {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn parameters(&self) -> &Value {
        &self.parameters
    }

    fn execute<'a>(
        &'a self,
        args: Value,
        ctx: ToolContext,
    ) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(async move {
            let peer = self.client.shared().peer_for(&self.remote)?;
            let mut params = CallToolRequestParams::new(self.remote.to_string());
            params.arguments = match args {
                Value::Object(arguments) => Some(arguments),
                Value::Null => None,
                other => {
                    return Err(ToolError::new(format!(
                        "MCP tools take an object of arguments, not {other}"
                    )));
                }
            };
            let failed = |error: &dyn std::fmt::Display| {
                ToolError::new(format!(
                    "MCP server `{}`: the call failed: {error}",
                    self.client.name()
                ))
            };
            let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
            let timeout = self.client.shared().call_timeout();
            let mut options = PeerRequestOptions::no_options();
            options.timeout = Some(timeout);
            let handle = peer
                .send_request_with_option(request, options)
                .await
                .map_err(|error| failed(&error))?;
            // The request's own progress token: its notifications are this call's.
            let _progress = self
                .client
                .shared()
                .track_progress(&handle.progress_token, &ctx);
            let id = handle.id.clone();
            let response = tokio::select! {
                response = handle.await_response() => response.map_err(|error| match error {
                    // The library told the server to stop the call.
                    ServiceError::Timeout { .. } => ToolError::new(format!(
                        "MCP server `{}`: `{}` did not answer within {} ms, and was cancelled",
                        self.client.name(),
                        self.remote,
                        timeout.as_millis()
                    )),
                    error => failed(&error),
                })?,
                () = ctx.cancel().cancelled() => {
                    // The run was aborted: the server is told to stop.
                    let _ = peer
                        .notify_cancelled(CancelledNotificationParam::new(
                            Some(id),
                            Some("the agent's run was aborted".to_owned()),
                        ))
                        .await;
                    return Err(ToolError::new("cancelled"));
                }
            };
            let result = match response {
                ServerResult::CallToolResult(result) => result,
                other => {
                    return Err(failed(&format!(
                        "the server answered something other than a tool result: {}",
                        serde_json::to_string(&other).unwrap_or_default()
                    )));
                }
            };
            output_of(result)
        })
    }
}

/// A tool result as Tiller's output: text and images as they are, a resource as
/// its text (or a line naming it, for binary data or a link), audio as a line
/// naming it; structured content in the details. An error result is the tool's
/// error, its text the message.
pub(crate) fn output_of(result: CallToolResult) -> Result<ToolOutput, ToolError> {
    let content = result.content.into_iter().map(content_of).collect();
    let output = ToolOutput {
        content,
        details: result.structured_content.unwrap_or(Value::Null),
        ..ToolOutput::default()
    };
    if result.is_error == Some(true) {
        let message = output.text_content();
        return Err(ToolError::new(if message.is_empty() {
            "the MCP tool failed and said nothing more".to_owned()
        } else {
            message
        }));
    }
    Ok(output)
}

/// One block of MCP content as Tiller's: text and images as they are, a
/// resource as its text (or a line naming it), anything else as a line naming it.
pub(crate) fn content_of(block: ContentBlock) -> Content {
    match block {
        ContentBlock::Text(text) => Content::text(text.text),
        ContentBlock::Image(image) => Content::Image(ImageContent {
            data: image.data,
            mime_type: image.mime_type,
        }),
        ContentBlock::Audio(audio) => Content::text(format!(
            "[audio: {}, {} bytes base64-encoded]",
            audio.mime_type,
            audio.data.len()
        )),
        ContentBlock::Resource(resource) => resource_content(resource.resource),
        ContentBlock::ResourceLink(link) => {
            Content::text(format!("[resource link {}: {}]", link.uri, link.name))
        }
        other => Content::text(format!(
            "[content of a kind Tiller does not know: {}]",
            serde_json::to_string(&other).unwrap_or_default()
        )),
    }
}

/// A resource's contents as Tiller's: its text under a line naming it, or a line
/// naming binary data.
pub(crate) fn resource_content(resource: ResourceContents) -> Content {
    match resource {
        ResourceContents::TextResourceContents { uri, text, .. } => {
            Content::text(format!("[resource {uri}]\n{text}"))
        }
        ResourceContents::BlobResourceContents {
            uri,
            mime_type,
            blob,
            ..
        } => Content::text(format!(
            "[resource {uri}: {}, {} bytes base64-encoded]",
            mime_type.as_deref().unwrap_or("binary"),
            blob.len()
        )),
        other => Content::text(format!(
            "[a resource of a kind Tiller does not know: {}]",
            serde_json::to_string(&other).unwrap_or_default()
        )),
    }
}
