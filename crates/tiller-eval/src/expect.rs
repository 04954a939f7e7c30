//! What a case expects of a run, and the verdict of each expectation on what
//! the run showed.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::suite::AgentSource;

/// One expectation of a case (see the crate docs for the YAML).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Expectation {
    /// The answer's text holds this.
    Contains(String),
    /// The answer's text does not hold this.
    NotContains(String),
    /// The answer's text matches this regular expression.
    Regex(String),
    /// The answer's text is this, once trimmed.
    Equals(String),
    /// The structured output is valid against this JSON Schema.
    JsonSchema(Value),
    /// A tool was called by this name, with at least these arguments.
    ToolCalled(ToolCalled),
    /// No tool was called.
    NoTool(bool),
    /// The run took at most this many model turns.
    MaxTurns(u32),
    /// The run cost at most this many US dollars.
    MaxCostUsd(f64),
    /// The run took at most this many milliseconds.
    MaxLatencyMs(u64),
    /// Another agent judges the run against a rubric.
    Judge(Judge),
}

/// `tool_called`: a call to look for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCalled {
    /// The tool's name.
    pub name: String,
    /// Arguments the call must have (others may be there too).
    #[serde(default)]
    pub args: serde_json::Map<String, Value>,
    /// Its place among the run's calls, from 0, when the order matters.
    #[serde(default)]
    pub order: Option<usize>,
}

/// `judge`: the judging agent (a file or a definition), its rubric and the
/// lowest score that passes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Judge {
    /// The judge's agent file (relative to the suite's folder).
    #[serde(default)]
    pub agent: Option<PathBuf>,
    /// Or the judge's definition, in the suite's `agents` folder (`name` or
    /// `name@version`).
    #[serde(default)]
    pub definition: Option<String>,
    /// What the judge holds the run to.
    pub rubric: String,
    /// The lowest score that passes, from 0 to 1 (default 0.5).
    #[serde(default = "half")]
    pub min_score: f64,
}

impl Judge {
    /// Where the judge comes from, its file found from `folder`.
    pub fn source(&self, folder: &Path) -> Result<AgentSource, String> {
        AgentSource::of(self.agent.as_deref(), self.definition.as_deref(), folder)?
            .ok_or_else(|| "a judge is an agent file (`agent`) or a `definition`".to_owned())
    }
}

/// The most of an answer a failure quotes, in characters.
const EXCERPT_CHARS: usize = 200;

/// `text`, cut after [`EXCERPT_CHARS`] characters (marked `…`).
fn excerpt(text: &str) -> String {
    match text.char_indices().nth(EXCERPT_CHARS) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

fn half() -> f64 {
    0.5
}

/// What a run gave, as the expectations read it.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    /// The text of the run's last answer.
    pub text: String,
    /// The structured output, when it was valid.
    pub output: Option<Value>,
    /// Each call: its tool's name and arguments, in order.
    pub calls: Vec<(String, Value)>,
    /// The model's responses.
    pub turns: u32,
    /// What the run cost, in US dollars.
    pub cost_usd: f64,
    /// From the prompt to the run's end, in milliseconds.
    pub latency_ms: u64,
    /// The judge's verdict, when the case has one.
    pub judged: Option<Judged>,
    /// Why the case's judge gave no verdict, when it gave none.
    pub unjudged: Option<String>,
}

/// What a judge answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Judged {
    /// Whether the run meets the rubric.
    pub pass: bool,
    /// How well, from 0 to 1.
    pub score: f64,
    /// Why, in a sentence.
    pub reason: String,
}

impl Expectation {
    /// Whether the expectation can be checked at all: its pattern, schema and
    /// score; the reason when not.
    pub fn check_itself(&self) -> Result<(), String> {
        match self {
            Expectation::Regex(pattern) => regex::Regex::new(pattern)
                .map(drop)
                .map_err(|_| format!("`{pattern}` is not a regular expression")),
            Expectation::JsonSchema(schema) => jsonschema::validator_for(schema)
                .map(drop)
                .map_err(|error| format!("not a JSON Schema: {error}")),
            Expectation::Judge(judge) if !(0.0..=1.0).contains(&judge.min_score) => {
                Err(format!("min_score {} is not from 0 to 1", judge.min_score))
            }
            Expectation::MaxCostUsd(max) if !max.is_finite() || *max < 0.0 => {
                Err(format!("{max} is not a cost"))
            }
            _ => Ok(()),
        }
    }

    /// Why the expectation failed on `observed`; `None` when it held.
    pub fn failure(&self, observed: &Observed) -> Option<String> {
        let expectation = self;
        let failed = |what: String| Some(what);
        match expectation {
            Expectation::Contains(needle) => (!observed.text.contains(needle.as_str()))
                .then(|| format!("the answer does not contain {needle:?}")),
            Expectation::NotContains(needle) => observed
                .text
                .contains(needle.as_str())
                .then(|| format!("the answer contains {needle:?}")),
            Expectation::Regex(pattern) => match regex::Regex::new(pattern) {
                Ok(regex) if regex.is_match(&observed.text) => None,
                Ok(_) => failed(format!("the answer does not match /{pattern}/")),
                Err(_) => failed(format!("`{pattern}` is not a regular expression")),
            },
            Expectation::Equals(wanted) => (observed.text.trim() != wanted.trim()).then(|| {
                let answer = observed.text.trim();
                format!("the answer is {:?}, not {wanted:?}", excerpt(answer))
            }),
            Expectation::JsonSchema(schema) => {
                match (&observed.output, jsonschema::validator_for(schema)) {
                    (_, Err(error)) => failed(format!("the schema is not one: {error}")),
                    (None, _) => failed("no valid structured output".to_owned()),
                    (Some(value), Ok(validator)) => validator
                        .iter_errors(value)
                        .next()
                        .map(|error| format!("the output does not match the schema: {error}")),
                }
            }
            Expectation::ToolCalled(wanted) => {
                let fits = |(name, args): &(String, Value)| {
                    name == &wanted.name
                        && wanted
                            .args
                            .iter()
                            .all(|(key, value)| args.get(key) == Some(value))
                };
                let held = match wanted.order {
                    Some(at) => observed.calls.get(at).is_some_and(fits),
                    None => observed.calls.iter().any(fits),
                };
                (!held).then(|| {
                    let args = match wanted.args.is_empty() {
                        true => String::new(),
                        false => format!(" with {}", Value::Object(wanted.args.clone())),
                    };
                    let place = wanted
                        .order
                        .map(|at| format!(" as call {at}"))
                        .unwrap_or_default();
                    format!("no call of `{}`{args}{place}", wanted.name)
                })
            }
            Expectation::NoTool(true) => (!observed.calls.is_empty()).then(|| {
                format!(
                    "{} tool call(s), the first `{}`",
                    observed.calls.len(),
                    observed.calls[0].0
                )
            }),
            Expectation::NoTool(false) => None,
            Expectation::MaxTurns(max) => (observed.turns > *max)
                .then(|| format!("{} turns, more than {max}", observed.turns)),
            Expectation::MaxCostUsd(max) => (observed.cost_usd > *max)
                .then(|| format!("${:.6}, more than ${max}", observed.cost_usd)),
            Expectation::MaxLatencyMs(max) => (observed.latency_ms > *max)
                .then(|| format!("{} ms, more than {max}", observed.latency_ms)),
            Expectation::Judge(judge) => match &observed.judged {
                None => failed(format!(
                    "the judge gave no verdict: {}",
                    observed.unjudged.as_deref().unwrap_or("no answer")
                )),
                Some(judged) if judged.pass && judged.score >= judge.min_score => None,
                Some(judged) => failed(format!(
                    "the judge {} it (score {:.2}, {:.2} needed): {}",
                    if judged.pass { "passed" } else { "failed" },
                    judged.score,
                    judge.min_score,
                    judged.reason
                )),
            },
        }
    }
}
