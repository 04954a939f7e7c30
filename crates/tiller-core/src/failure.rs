//! What a failed callback gives: the error a hook, a guardrail or a
//! summarizer returns, and the text of a panic caught in a run.

/// Any error a callback reports.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The message of a panic payload.
pub fn panic_text(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(text) => *text,
        Err(payload) => payload.downcast_ref::<&str>().map_or_else(
            || "a panic without a message".to_owned(),
            |s| (*s).to_owned(),
        ),
    }
}
