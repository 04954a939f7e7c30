//! Writing an agent's events: as text for people, or as JSON lines for programs.
//!
//! In `text`, the answer streams to stdout as it arrives; each tool call becomes one
//! line on stderr when it ends, with its arguments and outcome; thinking goes to
//! stderr too, as does what sub-agents (`ask_agent`) write. In `jsonl`, each envelope (`agent_id`, `seq`, `event`) is one line of
//! stdout in the lean form of every wire ([`tiller::wire`]: an update carries its
//! piece), flushed as it is written; `jsonl-full` writes every update with the
//! message as it stands.

use std::collections::HashMap;
use std::io::{self, Write};

use serde_json::Value;
use tiller::wire::{Cursor, Updates};
use tiller::{AgentEvent, Delivered, Envelope, ai::AssistantEvent, runtime::Notice};

use crate::cli::EventFormat;

/// The longest tool result a text line shows.
const RESULT_PREVIEW: usize = 160;

/// Where events are written.
#[derive(Debug)]
pub struct Output {
    format: EventFormat,
    /// Whether stdout holds text not yet ended by a newline.
    line_open: bool,
    /// The arguments of running tool calls, by call id, for their closing line.
    /// The label and arguments of each call under way, by call id.
    tool_args: HashMap<String, (String, Value)>,
    /// Whether answers must match an output schema: their text is not streamed,
    /// and the validated JSON is written once the run ends.
    structured: bool,
    /// The form of each JSON line.
    cursor: Cursor,
}

impl Output {
    /// Output in `format`.
    pub fn new(format: EventFormat) -> Self {
        Output {
            format,
            line_open: false,
            tool_args: HashMap::new(),
            structured: false,
            cursor: Cursor::new(match format {
                EventFormat::JsonlFull => Updates::Full,
                EventFormat::Text | EventFormat::Jsonl => Updates::Lean,
            }),
        }
    }

    /// The same output for an agent whose answers must match an output schema.
    pub fn structured(mut self, structured: bool) -> Self {
        self.structured = structured;
        self
    }

    /// Writes one envelope. An error means stdout is gone.
    pub fn write(&mut self, envelope: &Envelope) -> io::Result<()> {
        match self.format {
            EventFormat::Jsonl | EventFormat::JsonlFull => {
                let json = self.cursor.frame(envelope).json();
                let mut stdout = io::stdout().lock();
                stdout.write_all(&json)?;
                stdout.write_all(b"\n")?;
                stdout.flush()
            }
            EventFormat::Text => match &envelope.event {
                Delivered::Event(event) => self.text(event),
                Delivered::Notice(notice) => {
                    self.end_line()?;
                    crate::say!("[{}]", notice_text(notice));
                    Ok(())
                }
            },
        }
    }

    /// Ends a line of answer text left open on stdout.
    pub fn end_line(&mut self) -> io::Result<()> {
        if std::mem::take(&mut self.line_open) {
            let mut stdout = io::stdout().lock();
            stdout.write_all(b"\n")?;
            stdout.flush()?;
        }
        Ok(())
    }

    fn text(&mut self, event: &AgentEvent) -> io::Result<()> {
        match event {
            AgentEvent::MessageUpdate {
                assistant_message_event,
                ..
            } => match assistant_message_event {
                AssistantEvent::TextDelta { .. } if self.structured => {}
                AssistantEvent::TextDelta { delta, .. } => {
                    let mut stdout = io::stdout().lock();
                    stdout.write_all(delta.as_bytes())?;
                    stdout.flush()?;
                    self.line_open = !delta.ends_with('\n');
                }
                AssistantEvent::ThinkingDelta { delta, .. } => crate::say_part!("{delta}"),
                AssistantEvent::ThinkingEnd { .. } => crate::say!(),
                _ => {}
            },
            AgentEvent::ToolExecutionStart {
                tool_call_id,
                label,
                args,
                ..
            } => {
                self.tool_args
                    .insert(tool_call_id.clone(), (label.clone(), args.clone()));
            }
            AgentEvent::Action {
                action_type,
                payload,
                ..
            } => {
                self.end_line()?;
                crate::say!("[action {action_type} {payload}]");
            }
            AgentEvent::ToolExecutionEnd {
                tool_call_id,
                tool_name,
                result,
                is_error,
            } => self.tool_ended(tool_call_id, tool_name, result, *is_error)?,
            AgentEvent::ModelFallback { from, to, error } => {
                self.end_line()?;
                crate::say!("[{from} failed ({error}); asking {to}]");
            }
            AgentEvent::BudgetExceeded { .. } | AgentEvent::GuardrailTripped { .. } => {
                self.end_line()?;
                if let Some(exceeded) = event.budget_exceeded() {
                    crate::say!("[{exceeded}]");
                }
                if let Some(tripped) = event.guardrail_tripped() {
                    crate::say!("[{tripped}]");
                }
            }
            AgentEvent::AgentEnd {
                output: Some(tiller::run::Output::Valid { value }),
                ..
            } => {
                self.end_line()?;
                let mut stdout = io::stdout().lock();
                serde_json::to_writer_pretty(&mut stdout, value)?;
                stdout.write_all(b"\n")?;
                stdout.flush()?;
            }
            AgentEvent::ChildEvent { path, event, .. } => self.child(path, event)?,
            AgentEvent::CompactionEnd {
                tokens_before,
                tokens_after,
                summary_id,
                error,
                ..
            } => {
                self.end_line()?;
                match (summary_id, error) {
                    (Some(id), _) => crate::say!(
                        "[the conversation was compacted: {tokens_before} → {tokens_after} tokens; the summary is message {id}]"
                    ),
                    (None, error) => crate::say!(
                        "[the conversation was not compacted: {}]",
                        error.as_deref().unwrap_or("no reason given")
                    ),
                }
            }
            AgentEvent::MessageEnd { .. } | AgentEvent::AgentEnd { .. } => self.end_line()?,
            _ => {}
        }
        Ok(())
    }

    /// A tool call's end, with the label and arguments its start gave.
    fn tool_ended(
        &mut self,
        tool_call_id: &str,
        tool_name: &str,
        result: &tiller::ToolOutput,
        is_error: bool,
    ) -> io::Result<()> {
        self.end_line()?;
        let (label, args) = self
            .tool_args
            .remove(tool_call_id)
            .unwrap_or_else(|| (tool_name.to_owned(), Value::Null));
        let label = if label.is_empty() { tool_name } else { &label };
        let outcome = if result.streamed {
            "(the answer streamed above)".to_owned()
        } else {
            preview(&result.text_content())
        };
        if is_error {
            crate::say!("[{label} {args}] failed: {outcome}");
        } else {
            crate::say!("[{label} {args}] -> {outcome}");
        }
        Ok(())
    }

    /// A sub-agent's answer, under its path.
    fn child(&mut self, path: &[String], event: &AgentEvent) -> io::Result<()> {
        match event {
            AgentEvent::MessageStart { message } if message.as_assistant().is_some() => {
                self.end_line()?;
                crate::say_part!("[{}] ", path.join(" → "));
            }
            AgentEvent::MessageUpdate {
                assistant_message_event: AssistantEvent::TextDelta { delta, .. },
                ..
            } => crate::say_part!("{delta}"),
            AgentEvent::MessageEnd { message } if message.as_assistant().is_some() => {
                crate::say!()
            }
            _ => {}
        }
        Ok(())
    }
}

/// A notice in words.
pub fn notice_text(notice: &Notice) -> String {
    match notice {
        Notice::Lagged { missed } => format!("{missed} events were missed"),
        Notice::AgentRestarted { reason } => {
            format!("the agent failed and was restarted: {reason}")
        }
        Notice::AgentStopped { reason } => format!("the agent stopped: {reason}"),
        Notice::OwnerChanged { host, epoch } => {
            format!("the agent is held by host {host} now (epoch {epoch})")
        }
        Notice::TurnRestarted => "the turn in progress is run again from its start".to_owned(),
        other => format!("{other:?}"),
    }
}

/// The first line of `text`, cut to a readable length.
fn preview(text: &str) -> String {
    let first = text.lines().next().unwrap_or_default();
    let more = text.lines().nth(1).is_some();
    match first.char_indices().nth(RESULT_PREVIEW) {
        Some((cut, _)) => format!("{}…", &first[..cut]),
        None if more => format!("{first} …"),
        None => first.to_owned(),
    }
}
