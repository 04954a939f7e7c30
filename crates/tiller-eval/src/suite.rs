//! A suite as its file declares it: the agent, the models to compare, how many
//! runs, and the cases with what each expects (see the crate docs for the YAML).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tiller_core::Budget;

use crate::expect::{Expectation, Judge};

/// The largest suite file read, in bytes.
pub const MAX_SUITE_BYTES: u64 = 4 << 20;
/// The most runs one suite makes: cases × models × repetitions.
pub const MAX_RUNS: usize = 100_000;
/// The most runs at once.
pub const MAX_CONCURRENCY: usize = 64;
/// The longest name of a case or label of a model, in bytes (each is part of
/// its runs' session ids).
pub const MAX_NAME_BYTES: usize = 64;

/// A suite of cases, read by [`Suite::load`] or [`Suite::parse`].
#[derive(Debug, Clone, PartialEq)]
pub struct Suite {
    /// Its name: the file's `name`, else the file's stem.
    pub name: String,
    /// The agent under test: an agent file (`agent`, relative to the suite's
    /// folder) or a definition of `agents` (`definition`); a plain agent
    /// without instructions or tools when `None`.
    pub agent: Option<AgentSource>,
    /// The folder of agent files `definition`s are found in (`agents`,
    /// relative to the suite's folder), as `tiller serve --agents` reads it.
    pub agents: Option<PathBuf>,
    /// The models every case runs against, in order; empty: the one the agent
    /// file, the environment or the faux default chooses.
    pub models: Vec<ModelEntry>,
    /// Runs of each case against each model.
    pub repetitions: u32,
    /// Runs at once.
    pub concurrency: usize,
    /// The folder the suite's file is in, which its paths are relative to.
    pub folder: PathBuf,
    /// What the whole suite may spend (subjects and judges together).
    pub budget: Budget,
    /// How much worse than a baseline a case may get before it is flagged.
    pub thresholds: Thresholds,
    /// The cases, in order.
    pub cases: Vec<Case>,
}

/// Where an agent (the one under test, or a judge) comes from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum AgentSource {
    /// An agent file.
    File(PathBuf),
    /// A definition of the suite's `agents` folder: its latest version, or
    /// the one given (`name@version`).
    Definition {
        /// Its name.
        name: String,
        /// Its version, if one is asked for.
        version: Option<String>,
    },
}

impl AgentSource {
    /// `file`, found from `folder`, or `definition` (`name` or `name@version`):
    /// exactly one of them.
    pub(crate) fn of(
        file: Option<&Path>,
        definition: Option<&str>,
        folder: &Path,
    ) -> Result<Option<AgentSource>, String> {
        match (file, definition) {
            (Some(_), Some(_)) => Err("give `agent` (a file) or `definition`, not both".into()),
            (Some(file), None) => Ok(Some(AgentSource::File(folder.join(file)))),
            (None, Some(definition)) => {
                let (name, version) = match definition.split_once('@') {
                    Some((name, version)) => (name, Some(version.to_owned())),
                    None => (definition, None),
                };
                Ok(Some(AgentSource::Definition {
                    name: name.to_owned(),
                    version,
                }))
            }
            (None, None) => Ok(None),
        }
    }
}

impl std::fmt::Display for AgentSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AgentSource::File(path) => write!(f, "{}", path.display()),
            AgentSource::Definition {
                name,
                version: None,
            } => write!(f, "definition `{name}`"),
            AgentSource::Definition {
                name,
                version: Some(version),
            } => write!(f, "definition `{name}` version {version}"),
        }
    }
}

/// A model to run the cases against: `provider/id` (or any name `--model`
/// takes), or its parts with a server of its own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ModelEntry {
    /// As `--model` takes it: `openai/gpt-4o-mini`, `faux`…
    Named(String),
    /// Its parts, as the command line's `--provider`, `--model` and `--base-url`.
    Parts(ModelParts),
}

/// [`ModelEntry::Parts`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelParts {
    /// Its label in reports (default: `model`, else `provider`).
    #[serde(default)]
    pub name: Option<String>,
    /// The provider, such as `openai`.
    #[serde(default)]
    pub provider: Option<String>,
    /// The model's id.
    #[serde(default)]
    pub model: Option<String>,
    /// The server, for an OpenAI-compatible one (llama.cpp, vLLM, Ollama…).
    #[serde(default)]
    pub base_url: Option<String>,
}

impl ModelEntry {
    /// Its label in reports.
    pub fn label(&self) -> &str {
        match self {
            ModelEntry::Named(name) => name,
            ModelEntry::Parts(parts) => parts
                .name
                .as_deref()
                .or(parts.model.as_deref())
                .or(parts.provider.as_deref())
                .unwrap_or("model"),
        }
    }
}

/// How much worse than the baseline a case may get, per (case, model).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Thresholds {
    /// The pass rate may fall by this much (0: any fall is flagged).
    pub pass_rate: f64,
    /// The mean score may fall by this much.
    pub score: f64,
    /// The cost may rise by this fraction of the baseline's (0.1: 10%).
    pub cost: f64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            pass_rate: 0.0,
            score: 0.05,
            cost: 0.1,
        }
    }
}

/// One case: what the agent is given and what is expected of its run.
#[derive(Debug, Clone, PartialEq)]
pub struct Case {
    /// Its name, unique in the suite (letters, digits, `-`, `_` and `.`).
    pub name: String,
    /// What the run starts from.
    pub input: Input,
    /// The user the run is for, if the case says.
    pub user_id: Option<String>,
    /// Tools answered by the case instead of running, by name.
    pub stubs: BTreeMap<String, Stub>,
    /// What the run must show.
    pub expect: Vec<Expectation>,
}

/// What a run starts from.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// One prompt.
    Prompt(String),
    /// A conversation, ending with the user's turn: the earlier turns are the
    /// transcript, the last is the prompt.
    Conversation(Vec<Turn>),
}

impl Case {
    /// The case's judge, if it has one.
    pub fn judge(&self) -> Option<&Judge> {
        self.expect
            .iter()
            .find_map(|expectation| match expectation {
                Expectation::Judge(judge) => Some(judge),
                _ => None,
            })
    }
}

/// A turn of a case's conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Turn {
    /// The user said this.
    User(String),
    /// The assistant answered this.
    Assistant(String),
}

/// A tool's answer given by the case: its text, or an error the model reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Stub {
    /// The tool answers this text.
    Text(String),
    /// The tool fails with this message.
    Error {
        /// The message.
        error: String,
    },
}

/// Why a suite cannot be used: its file, the field and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{}: {reason}", path.display(), field.as_deref().map(|f| format!(": {f}")).unwrap_or_default())]
pub struct SuiteError {
    /// The suite's file.
    pub path: PathBuf,
    /// The field at fault, such as `cases[2].expect[0]`, when one is.
    pub field: Option<String>,
    /// What is wrong.
    pub reason: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSuite {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    agent: Option<PathBuf>,
    #[serde(default)]
    agents: Option<PathBuf>,
    #[serde(default)]
    definition: Option<String>,
    #[serde(default)]
    models: Vec<ModelEntry>,
    #[serde(default)]
    repetitions: Option<u32>,
    #[serde(default)]
    concurrency: Option<usize>,
    #[serde(default)]
    budget: Budget,
    #[serde(default)]
    thresholds: Thresholds,
    cases: Vec<RawCase>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCase {
    name: String,
    #[serde(default)]
    input: Option<String>,
    #[serde(default)]
    conversation: Option<Vec<Turn>>,
    #[serde(default)]
    context: RawContext,
    #[serde(default)]
    stubs: BTreeMap<String, Stub>,
    #[serde(default)]
    expect: Vec<Expectation>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawContext {
    #[serde(default)]
    user_id: Option<String>,
}

impl Suite {
    /// Reads the suite at `path` (YAML, or JSON when it ends in `.json`), at
    /// most [`MAX_SUITE_BYTES`].
    pub fn load(path: impl AsRef<Path>) -> Result<Suite, SuiteError> {
        let path = path.as_ref();
        let failed = |reason: String| SuiteError {
            path: path.to_owned(),
            field: None,
            reason,
        };
        let size = std::fs::metadata(path)
            .map_err(|error| failed(format!("cannot read it: {error}")))?
            .len();
        if size > MAX_SUITE_BYTES {
            return Err(failed(format!(
                "{size} bytes, more than the {MAX_SUITE_BYTES} a suite may have"
            )));
        }
        let text = std::fs::read_to_string(path)
            .map_err(|error| failed(format!("cannot read it: {error}")))?;
        Suite::parse(path, &text)
    }

    /// The suite `text` declares, read as if from `path` (whose folder the agent
    /// and judge files are found from).
    pub fn parse(path: impl AsRef<Path>, text: &str) -> Result<Suite, SuiteError> {
        let path = path.as_ref();
        let error = |field: Option<String>, reason: String| SuiteError {
            path: path.to_owned(),
            field,
            reason,
        };
        let raw: RawSuite = if path.extension().is_some_and(|ext| ext == "json") {
            let de = &mut serde_json::Deserializer::from_str(text);
            serde_path_to_error::deserialize(de)
                .map_err(|e| error(field_path(e.path()), e.inner().to_string()))?
        } else {
            let mut failed_at = None;
            let options = serde_saphyr::options! { with_snippet: false };
            serde_saphyr::with_deserializer_from_str_with_options(text, options, |de| {
                serde_path_to_error::deserialize(de).map_err(|e| {
                    failed_at = field_path(e.path());
                    e.into_inner()
                })
            })
            .map_err(|e| error(failed_at, e.to_string()))?
        };
        let folder = path.parent().unwrap_or(Path::new(""));
        let name = raw
            .name
            .or_else(|| Some(path.file_stem()?.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "suite".to_owned());
        let repetitions = raw.repetitions.unwrap_or(1);
        if repetitions == 0 {
            return Err(error(Some("repetitions".into()), "at least 1".into()));
        }
        let concurrency = raw.concurrency.unwrap_or(4);
        if !(1..=MAX_CONCURRENCY).contains(&concurrency) {
            return Err(error(
                Some("concurrency".into()),
                format!("from 1 to {MAX_CONCURRENCY}"),
            ));
        }
        let agent = AgentSource::of(raw.agent.as_deref(), raw.definition.as_deref(), folder)
            .map_err(|reason| error(None, reason))?;
        let agents = raw.agents.map(|agents| folder.join(agents));
        let needs_folder = |source: &Option<AgentSource>| {
            matches!(source, Some(AgentSource::Definition { .. })) && agents.is_none()
        };
        if needs_folder(&agent) {
            return Err(error(
                Some("definition".into()),
                "a definition is found in the folder `agents` names: give it".into(),
            ));
        }
        let t = raw.thresholds;
        if ![t.pass_rate, t.score, t.cost]
            .iter()
            .all(|limit| limit.is_finite() && *limit >= 0.0)
        {
            return Err(error(
                Some("thresholds".into()),
                "each is a number of at least 0".into(),
            ));
        }
        let mut labels = BTreeSet::new();
        let mut parts = BTreeSet::new();
        for (at, model) in raw.models.iter().enumerate() {
            if let ModelEntry::Parts(parts) = model
                && parts.provider.is_none()
                && parts.model.is_none()
                && parts.base_url.is_none()
            {
                return Err(error(
                    Some(format!("models[{at}]")),
                    "names no provider, model or base_url".into(),
                ));
            }
            if model.label().len() > MAX_NAME_BYTES {
                return Err(error(
                    Some(format!("models[{at}]")),
                    format!(
                        "a label longer than {MAX_NAME_BYTES} bytes (give it a shorter `name`)"
                    ),
                ));
            }
            if !labels.insert(model.label()) || !parts.insert(session_part(model.label())) {
                return Err(error(
                    Some(format!("models[{at}]")),
                    format!(
                        "`{}` is listed twice, or as another model's name with other signs (give one a `name`)",
                        model.label()
                    ),
                ));
            }
        }
        if raw.cases.is_empty() {
            return Err(error(Some("cases".into()), "no cases".into()));
        }
        let runs = raw
            .cases
            .len()
            .saturating_mul(raw.models.len().max(1))
            .saturating_mul(repetitions as usize);
        if runs > MAX_RUNS {
            return Err(error(
                None,
                format!("{runs} runs (cases × models × repetitions), more than {MAX_RUNS}"),
            ));
        }
        let mut names = BTreeSet::new();
        let mut cases = Vec::with_capacity(raw.cases.len());
        for (at, case) in raw.cases.into_iter().enumerate() {
            let field = |what: &str| Some(format!("cases[{at}]{what}"));
            let fine = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
            if case.name.is_empty()
                || case.name.len() > MAX_NAME_BYTES
                || !case.name.chars().all(fine)
            {
                return Err(error(
                    field(".name"),
                    format!(
                        "`{}`: a case's name is 1 to {MAX_NAME_BYTES} letters, digits, `-`, `_` and `.`",
                        case.name
                    ),
                ));
            }
            if !names.insert(case.name.clone()) {
                return Err(error(
                    field(".name"),
                    format!("`{}` is used twice", case.name),
                ));
            }
            let input = match (case.input, case.conversation) {
                (Some(prompt), None) if !prompt.trim().is_empty() => Input::Prompt(prompt),
                (None, Some(turns)) if matches!(turns.last(), Some(Turn::User(_))) => {
                    Input::Conversation(turns)
                }
                (None, Some(_)) => {
                    return Err(error(
                        field(".conversation"),
                        "must end with a `user` turn".into(),
                    ));
                }
                (Some(_), None) => return Err(error(field(".input"), "is empty".into())),
                _ => {
                    return Err(error(
                        field(""),
                        "give either `input` or `conversation`".into(),
                    ));
                }
            };
            let mut judged = false;
            for (index, expectation) in case.expect.iter().enumerate() {
                let field = field(&format!(".expect[{index}]"));
                expectation
                    .check_itself()
                    .map_err(|reason| error(field.clone(), reason))?;
                if let Expectation::Judge(judge) = expectation {
                    if judged {
                        return Err(error(field, "a case has one judge".into()));
                    }
                    judged = true;
                    let source = judge
                        .source(folder)
                        .map_err(|reason| error(field.clone(), reason))?;
                    if needs_folder(&Some(source)) {
                        return Err(error(
                            field,
                            "a definition is found in the folder `agents` names: give it".into(),
                        ));
                    }
                }
            }
            cases.push(Case {
                name: case.name,
                input,
                user_id: case.context.user_id,
                stubs: case.stubs,
                expect: case.expect,
            });
        }
        Ok(Suite {
            name,
            agent,
            agents,
            folder: folder.to_owned(),
            models: raw.models,
            repetitions,
            concurrency,
            budget: raw.budget,
            thresholds: raw.thresholds,
            cases,
        })
    }

    /// Where the judge of `case` comes from, if it has one.
    pub fn judge_of(&self, case: &Case) -> Option<AgentSource> {
        // Checked when the suite was read.
        case.judge()?.source(&self.folder).ok()
    }

    /// How many runs the suite makes.
    pub fn runs(&self) -> usize {
        self.cases.len() * self.models.len().max(1) * self.repetitions as usize
    }
}

/// A model's label as a part of a session id: its letters, digits, `-` and
/// `_`, anything else as `-`.
pub(crate) fn session_part(label: &str) -> String {
    label
        .chars()
        .map(|c| match c {
            c if c.is_ascii_alphanumeric() || c == '-' || c == '_' => c,
            _ => '-',
        })
        .collect()
}

/// The path of a field, without the unknown last step a syntax error leaves;
/// `None` for the whole document.
fn field_path(path: &serde_path_to_error::Path) -> Option<String> {
    let path = path.to_string();
    let path = path.strip_suffix(".?").unwrap_or(&path);
    (!path.is_empty() && path != "?" && path != ".").then(|| path.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> Result<Suite, String> {
        Suite::parse("evals/suite.yaml", text).map_err(|error| error.to_string())
    }

    #[test]
    fn a_suite_reads_with_its_defaults_and_paths_from_its_folder() {
        let suite = parsed(
            "agent: agents/helper.yaml\ncases:\n  - name: hi\n    input: Hello\n    expect:\n      - contains: Hello\n      - judge: {agent: judge.yaml, rubric: Kind}\n",
        )
        .unwrap();
        assert_eq!(suite.name, "suite");
        assert_eq!(
            suite.agent,
            Some(AgentSource::File("evals/agents/helper.yaml".into()))
        );
        assert_eq!((suite.repetitions, suite.concurrency), (1, 4));
        assert_eq!(suite.runs(), 1);
        assert_eq!(
            suite.judge_of(&suite.cases[0]),
            Some(AgentSource::File("evals/judge.yaml".into()))
        );
        let suite = parsed(
            "agents: ../agents\ndefinition: support@1.2\ncases:\n  - name: hi\n    input: Hello\n    expect: [{judge: {definition: critic, rubric: Kind}}]\n",
        )
        .unwrap();
        assert_eq!(suite.agents, Some(PathBuf::from("evals/../agents")));
        assert_eq!(
            (suite.agent.clone(), suite.judge_of(&suite.cases[0])),
            (
                Some(AgentSource::Definition {
                    name: "support".into(),
                    version: Some("1.2".into())
                }),
                Some(AgentSource::Definition {
                    name: "critic".into(),
                    version: None
                })
            )
        );
    }

    #[test]
    fn bad_suites_are_refused_naming_the_field() {
        let case = |rest: &str| format!("cases:\n  - name: a\n{rest}");
        for (text, wanted) in [
            (
                case("    input: hi\n    expect: [{regex: \"(\"}]\n"),
                "evals/suite.yaml: cases[0].expect[0]: `(` is not a regular expression",
            ),
            (
                case("    input: hi\n    expect: [{smells: nice}]\n"),
                "evals/suite.yaml: cases[0].expect[0]: unknown variant `smells`",
            ),
            (
                case("    conversation: [{assistant: hi}]\n"),
                "evals/suite.yaml: cases[0].conversation: must end with a `user` turn",
            ),
            (
                case("    input: hi\n  - name: a\n    input: again\n"),
                "evals/suite.yaml: cases[1].name: `a` is used twice",
            ),
            (
                "concurrency: 0\ncases: [{name: a, input: hi}]\n".to_owned(),
                "evals/suite.yaml: concurrency: from 1 to 64",
            ),
            (
                "models: [faux, faux]\ncases: [{name: a, input: hi}]\n".to_owned(),
                "evals/suite.yaml: models[1]: `faux` is listed twice",
            ),
            (
                "models: [a.b, a-b]\ncases: [{name: a, input: hi}]\n".to_owned(),
                "evals/suite.yaml: models[1]: `a-b` is listed twice, or as another model's name with other signs",
            ),
            (
                "definition: support\ncases: [{name: a, input: hi}]\n".to_owned(),
                "evals/suite.yaml: definition: a definition is found in the folder `agents` names",
            ),
            (
                "agent: a.yaml\ndefinition: support\ncases: [{name: a, input: hi}]\n".to_owned(),
                "evals/suite.yaml: give `agent` (a file) or `definition`, not both",
            ),
            (
                case("    input: hi\n    expect: [{judge: {rubric: Kind}}]\n"),
                "evals/suite.yaml: cases[0].expect[0]: a judge is an agent file (`agent`) or a `definition`",
            ),
            (
                "cases: [{name: a b, input: hi}]\n".to_owned(),
                "evals/suite.yaml: cases[0].name: `a b`: a case's name is 1 to 64 letters, digits, `-`, `_` and `.`",
            ),
            (
                "thresholds: {score: -1}\ncases: [{name: a, input: hi}]\n".to_owned(),
                "evals/suite.yaml: thresholds: each is a number of at least 0",
            ),
            (
                "repetitions: 100000\ncases: [{name: a, input: hi}, {name: b, input: hi}]\n"
                    .to_owned(),
                "evals/suite.yaml: 200000 runs (cases × models × repetitions), more than 100000",
            ),
        ] {
            let refused = parsed(&text).unwrap_err();
            assert!(refused.starts_with(wanted), "{text}: {refused}");
        }
    }
}
