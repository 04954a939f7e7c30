//! Evaluations: know when an agent got worse.
//!
//! A suite names the agent under test (an agent file or a definition), the models to compare,
//! how many runs of each case, how many at once and what the whole suite may
//! spend; each case gives an input and what its run must show:
//!
//! ```yaml
//! agent: agents/support.yaml        # relative to the suite's folder; default: a plain agent
//! # or: agents: agents  and  definition: support@1.2.0  (a definition of that folder)
//! models: [faux, openai/gpt-4o-mini, {name: local, provider: llamacpp, base_url: "http://127.0.0.1:8080/v1"}]
//! repetitions: 3
//! concurrency: 4
//! budget: {cost_usd: 1.0}           # subjects and judges together
//! thresholds: {pass_rate: 0, score: 0.05, cost: 0.1}   # for --baseline
//! cases:
//!   - name: weather
//!     input: What is the weather in Paris?   # or conversation: [{user: …}, {assistant: …}, {user: …}]
//!     context: {user_id: ada}
//!     stubs: {get_weather: "Sunny, 21 °C"}    # or {get_weather: {error: "…"}}
//!     expect:
//!       - tool_called: {name: get_weather, args: {city: Paris}, order: 0}
//!       - contains: Sunny
//!       - not_contains: sorry
//!       - regex: "2[01] ?°C"
//!       - max_turns: 3
//!       - max_cost_usd: 0.01
//!       - max_latency_ms: 20000
//!       - judge: {agent: judge.yaml, rubric: Answers in one friendly sentence, min_score: 0.7}   # or definition: NAME
//! ```
//!
//! Other expectations: `equals` (the answer, trimmed), `json_schema` (the
//! structured output), `no_tool: true`. A judge is another agent (a file or a
//! definition) with no tools; it answers `{pass, score, reason}` as structured output.
//!
//! A run that did not complete scores 0; once the suite's budget runs out, the
//! runs not yet started are not made (the report says it is not complete).
//!
//! Every run is an agent of its own in a session of its own,
//! `eval-{run}.{case}.{model}.{repetition}`, owned by the tenant `eval-{run}`
//! (`tiller sessions rm --tenant eval-{run}` deletes them all), and its context
//! says it is an evaluation ([`tiller_core::AgentContext::is_evaluation`]).
//!
//! ```
//! use tiller_eval::{Evaluation, Suite};
//! use tiller_runtime::Supervisor;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let suite = Suite::parse(
//!     "evals/hello.yaml",
//!     "models: [faux]\ncases:\n  - name: echo\n    input: Hello\n    expect: [{contains: 'You said: \"Hello\"'}, {no_tool: true}]\n",
//! )?;
//! let supervisor = Supervisor::start().await?;
//! let report = Evaluation::new(&suite).with_run("first").run(&supervisor).await?;
//! assert_eq!((report.passed, report.runs), (1, 1));
//! print!("{}", report.table());
//! # Ok(())
//! # }
//! ```

mod agent;
pub mod expect;
mod judge;
pub mod report;
mod runner;
mod stub;
pub mod suite;

use std::collections::BTreeMap;

use tiller_ai::Model;
use tiller_runtime::Supervisor;

pub use expect::{Expectation, Judged, Observed};
pub use report::{Cell, Metric, Regression, Report, RunReport};
pub use suite::{AgentSource, Case, Input, ModelEntry, Stub, Suite, SuiteError, Thresholds};

/// Why a suite could not be run (a run that fails is in the [`Report`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EvalError {
    /// The agent file under test or a judge's cannot be used.
    #[error("{0}")]
    Agent(String),
    /// A model the suite names cannot be used.
    #[error("{0}")]
    Model(String),
    /// A case stubs a tool the agent does not have.
    #[error("case `{case}`: {reason}")]
    Stub {
        /// The case.
        case: String,
        /// What is wrong.
        reason: String,
    },
    /// The run id is not 1 to [`suite::MAX_NAME_BYTES`] letters, digits, `-` and `_`.
    #[error("`{0}` is not a run id: use 1 to 64 letters, digits, `-` and `_`")]
    RunId(String),
    /// The store has sessions or spending of this run already: a run id is
    /// used once.
    #[error("the store has a run `{0}` already: choose another run id")]
    RunExists(String),
    /// The session store failed.
    #[error("the session store: {0}")]
    Store(String),
}

/// How far a suite's run has got, told after each run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Runs ended.
    pub done: usize,
    /// Runs in all.
    pub total: usize,
    /// Runs that passed.
    pub passed: usize,
}

/// Where the environment's variables are read from.
type Variables = Box<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// Who is told the progress.
type Teller<'a> = Box<dyn FnMut(&Progress) + Send + 'a>;

/// A suite about to run: its run id, the host's own models and where progress
/// is told.
pub struct Evaluation<'a> {
    suite: &'a Suite,
    run: String,
    models: BTreeMap<String, Model>,
    var: Variables,
    progress: Option<Teller<'a>>,
}

impl std::fmt::Debug for Evaluation<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Evaluation")
            .field("suite", &self.suite.name)
            .field("run", &self.run)
            .field("models", &self.models.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl<'a> Evaluation<'a> {
    /// `suite`, under a new run id, with models chosen from the environment.
    pub fn new(suite: &'a Suite) -> Self {
        Evaluation {
            suite,
            run: tiller_ai::new_id(),
            models: BTreeMap::new(),
            var: Box::new(|name| {
                std::env::var(name)
                    .ok()
                    .filter(|value| !value.trim().is_empty())
            }),
            progress: None,
        }
    }

    /// The same, under the run id `run` (letters, digits, `-` and `_`).
    pub fn with_run(mut self, run: impl Into<String>) -> Self {
        self.run = run.into();
        self
    }

    /// The same, with the suite's model labelled `label` (in its `models`) taken
    /// as `model` rather than chosen by name: a host's own model, such as a faux
    /// one.
    pub fn with_model(mut self, label: impl Into<String>, model: Model) -> Self {
        self.models.insert(label.into(), model);
        self
    }

    /// The same, reading the environment's variables (provider keys,
    /// `TILLER_MODEL`…) through `var`.
    pub fn with_env(
        mut self,
        var: impl Fn(&str) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.var = Box::new(var);
        self
    }

    /// The same, telling `progress` after each run.
    pub fn on_progress(mut self, progress: impl FnMut(&Progress) + Send + 'a) -> Self {
        self.progress = Some(Box::new(progress));
        self
    }

    /// The run's id.
    pub fn run_id(&self) -> &str {
        &self.run
    }

    /// The tenant that owns the run's sessions: `eval-{run}`.
    pub fn tenant(&self) -> String {
        format!("eval-{}", self.run)
    }

    /// Runs every case against every model, `repetitions` times each, at most
    /// `concurrency` at once, under `supervisor` (whose store keeps the runs'
    /// sessions); the report says how each did. Refused before any run when
    /// the run id is taken, or an agent, model or stub cannot be used.
    pub async fn run(self, supervisor: &Supervisor) -> Result<Report, EvalError> {
        let fine = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
        let length = 1..=suite::MAX_NAME_BYTES;
        if !length.contains(&self.run.len()) || !self.run.chars().all(fine) {
            return Err(EvalError::RunId(self.run));
        }
        runner::run(self, supervisor).await
    }
}
