//! A caller's restatement of what a sub-agent already streamed, kept from its
//! subscribers: after a call whose result was streamed and marked
//! [`ToolOutput::quiet_restatement`](crate::ToolOutput::quiet_restatement), each text
//! block of the next response is held back while it is, so far, the start of one
//! of those results (whitespace aside). A block that turns out to be that whole
//! result is never streamed: its `text_start` and `text_end` go out (the block's
//! place stays known) without its deltas, and `message_end` (the transcript) has
//! it whole. A block that stops matching is released at once, in order,
//! and streams on as usual.
//!
//! Under the child-content rule (`Restatements::all`, see
//! [`RunOptions::quiet_after_child_content`](crate::RunOptions::quiet_after_child_content))
//! every text block is kept so: its start and end go out, its deltas never.
//!
//! The caller builds each update's message from what went out alone, so held
//! text is in no update.

use tiller_ai::AssistantEvent;

/// The text block held back, and what it matches against.
pub(crate) struct Restatements<T> {
    /// The streamed results, whitespace collapsed.
    echoes: Vec<String>,
    /// The events of the block held back, each with what goes with it.
    held: Vec<(AssistantEvent, T)>,
    /// The block's text so far, whitespace collapsed.
    text: String,
    /// Whether a block is being held back.
    holding: bool,
    /// Every text block is kept back (the child-content rule), whatever it says.
    all: bool,
}

/// `text` with each run of whitespace one space, none at the start.
fn collapse(text: &str, into: &mut String) {
    for c in text.chars() {
        if c.is_whitespace() {
            if !into.is_empty() && !into.ends_with(' ') {
                into.push(' ');
            }
        } else {
            into.push(c);
        }
    }
}

impl<T> Restatements<T> {
    /// Holding back restatements of `echoes` (none: everything passes).
    pub(crate) fn new(echoes: &[String]) -> Self {
        let echoes = echoes
            .iter()
            .map(|echo| {
                let mut collapsed = String::new();
                collapse(echo, &mut collapsed);
                collapsed.trim_end().to_owned()
            })
            .filter(|echo| !echo.is_empty())
            .collect();
        Restatements {
            echoes,
            held: Vec::new(),
            text: String::new(),
            holding: false,
            all: false,
        }
    }

    /// Keeping back the text of every text block: its start and end pass, its
    /// deltas do not.
    pub(crate) fn all() -> Self {
        Restatements {
            all: true,
            ..Restatements::new(&[])
        }
    }

    /// Whether nothing is to be held back.
    pub(crate) fn is_empty(&self) -> bool {
        self.echoes.is_empty() && !self.all
    }

    /// Takes the next event of the response; what to emit now, in order.
    pub(crate) fn pass(&mut self, event: AssistantEvent, with: T) -> Vec<(AssistantEvent, T)> {
        if self.all {
            return match event {
                AssistantEvent::TextDelta { .. } => Vec::new(),
                event => vec![(event, with)],
            };
        }
        if self.echoes.is_empty() {
            return vec![(event, with)];
        }
        match &event {
            AssistantEvent::TextStart { .. } => {
                let out = self.release();
                self.holding = true;
                self.held.push((event, with));
                out
            }
            AssistantEvent::TextDelta { delta, .. } if self.holding => {
                collapse(delta, &mut self.text);
                self.held.push((event, with));
                let so_far = self.text.trim_end();
                if self.echoes.iter().any(|echo| echo.starts_with(so_far)) {
                    Vec::new()
                } else {
                    self.release()
                }
            }
            AssistantEvent::TextEnd { .. } if self.holding => {
                let text = self.text.trim_end();
                if self.echoes.iter().any(|echo| echo == text) {
                    // The whole block restates a streamed result: its place, not
                    // its text again.
                    let mut out = self.release();
                    out.truncate(1);
                    out.push((event, with));
                    out
                } else {
                    let mut out = self.release();
                    out.push((event, with));
                    out
                }
            }
            _ => {
                let mut out = self.release();
                out.push((event, with));
                out
            }
        }
    }

    /// Lets out what is held (the response ended, or a block stopped matching).
    pub(crate) fn release(&mut self) -> Vec<(AssistantEvent, T)> {
        self.holding = false;
        self.text.clear();
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use pretty_assertions::assert_eq;

    use super::*;

    fn block(pieces: &[&str]) -> Vec<AssistantEvent> {
        let mut events = vec![AssistantEvent::TextStart { content_index: 0 }];
        events.extend(pieces.iter().map(|piece| AssistantEvent::TextDelta {
            content_index: 0,
            delta: (*piece).to_owned(),
        }));
        events.push(AssistantEvent::TextEnd {
            content_index: 0,
            signature: None,
        });
        events
    }

    fn passed(echoes: &[&str], events: Vec<AssistantEvent>) -> Vec<usize> {
        let echoes: Vec<String> = echoes.iter().map(|echo| (*echo).to_owned()).collect();
        let mut filter = Restatements::new(&echoes);
        let mut out = Vec::new();
        for (n, event) in events.into_iter().enumerate() {
            out.extend(filter.pass(event, n).into_iter().map(|(_, n)| n));
        }
        out.extend(filter.release().into_iter().map(|(_, n)| n));
        out
    }

    #[test]
    fn a_whole_restatement_is_dropped_and_anything_else_streams_in_order() {
        let echo = "Oslo has 709,000 people.";
        // The same words, whitespace aside: the block's start and end, no text.
        assert_eq!(
            passed(&[echo], block(&["Oslo has ", "709,000\n", "people. "])),
            [0, 4]
        );
        // A different answer: everything, in order, once it stops matching.
        assert_eq!(
            passed(&[echo], block(&["Oslo has ", "about 700k."])),
            [0, 1, 2, 3]
        );
        // The start of the result only: released at the block's end.
        assert_eq!(passed(&[echo], block(&["Oslo has"])), [0, 1, 2]);
        // No streamed result: nothing is held.
        assert_eq!(
            passed(&[], block(&["Oslo has ", "709,000 people."])),
            [0, 1, 2, 3]
        );
    }
}
