//! What a suite's run found: per case and model, the pass rate, mean score,
//! cost and latency, with each run's failures and session; as a table, JSON or
//! JUnit XML, and compared with a baseline.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::suite::Thresholds;

/// A suite's run, as `tiller eval --json` writes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// The suite's name.
    pub suite: String,
    /// The run's id: its sessions are `eval-{run}.…`, its tenant `eval-{run}`.
    pub run: String,
    /// The models' labels, in the suite's order.
    pub models: Vec<String>,
    /// How much worse a case may get before a comparison flags it.
    pub thresholds: Thresholds,
    /// Whether every run was made: `false` when the suite's budget ran out
    /// first (the runs not made are failures saying so).
    pub complete: bool,
    /// Runs that passed.
    pub passed: usize,
    /// Runs in the suite.
    pub runs: usize,
    /// One per case and model: cases in the suite's order, each with every
    /// model in order.
    pub cells: Vec<Cell>,
}

/// One case against one model, over its repetitions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cell {
    /// The case.
    pub case: String,
    /// The model's label.
    pub model: String,
    /// Runs that passed.
    pub passed: u32,
    /// `passed` over the runs, from 0 to 1.
    pub pass_rate: f64,
    /// The runs' mean score, from 0 to 1: a judge's score where the case has a
    /// judge, else the share of the case's expectations that held.
    pub mean_score: f64,
    /// The mean cost of a run of the agent under test (a judge's not counted),
    /// in US dollars.
    pub cost_usd: f64,
    /// The median run's time, in milliseconds.
    pub latency_p50_ms: u64,
    /// The 95th percentile of the runs' times, in milliseconds.
    pub latency_p95_ms: u64,
    /// Each run, in repetition order.
    pub runs: Vec<RunReport>,
}

/// One run of a case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    /// Its session, to open its transcript (`tiller sessions show`, the
    /// dashboard).
    pub session: String,
    /// Whether every expectation held and the run completed.
    pub passed: bool,
    /// Its score, from 0 to 1.
    pub score: f64,
    /// The model's responses.
    pub turns: u32,
    /// What it cost, in US dollars.
    pub cost_usd: f64,
    /// From the prompt to its end, in milliseconds.
    pub latency_ms: u64,
    /// Why it failed: one line per expectation that did not hold.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<String>,
}

impl RunReport {
    /// A run that was not made, or did not start, and why.
    pub(crate) fn not_made(session: String, failure: impl Into<String>) -> RunReport {
        RunReport {
            session,
            passed: false,
            score: 0.0,
            turns: 0,
            cost_usd: 0.0,
            latency_ms: 0,
            failures: vec![failure.into()],
        }
    }
}

impl Cell {
    /// The cell of `runs`, which are at least one.
    pub(crate) fn of(case: &str, model: &str, runs: Vec<RunReport>) -> Cell {
        let count = runs.len().max(1) as f64;
        let passed = runs.iter().filter(|run| run.passed).count() as u32;
        let mut latencies: Vec<u64> = runs.iter().map(|run| run.latency_ms).collect();
        latencies.sort_unstable();
        let rank = |share: f64| {
            let at = ((share * latencies.len() as f64).ceil() as usize).max(1) - 1;
            latencies.get(at).copied().unwrap_or_default()
        };
        Cell {
            case: case.to_owned(),
            model: model.to_owned(),
            passed,
            pass_rate: rounded(f64::from(passed) / count, 4),
            mean_score: rounded(runs.iter().map(|run| run.score).sum::<f64>() / count, 4),
            cost_usd: rounded(runs.iter().map(|run| run.cost_usd).sum::<f64>() / count, 8),
            latency_p50_ms: rank(0.5),
            latency_p95_ms: rank(0.95),
            runs,
        }
    }
}

/// `value` to `places` decimals, so that reports compare as written.
pub(crate) fn rounded(value: f64, places: i32) -> f64 {
    let scale = 10f64.powi(places);
    (value * scale).round() / scale
}

/// A case that got worse than in the baseline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Regression {
    /// The case.
    pub case: String,
    /// The model's label.
    pub model: String,
    /// What got worse.
    pub metric: Metric,
    /// The baseline's figure.
    pub before: f64,
    /// This run's.
    pub after: f64,
}

/// What a [`Regression`] measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// [`Cell::pass_rate`].
    PassRate,
    /// [`Cell::mean_score`].
    Score,
    /// [`Cell::cost_usd`].
    Cost,
}

impl std::fmt::Display for Regression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (what, before, after) = match self.metric {
            Metric::PassRate => ("pass rate", percent(self.before), percent(self.after)),
            Metric::Score => (
                "score",
                format!("{:.2}", self.before),
                format!("{:.2}", self.after),
            ),
            Metric::Cost => ("cost", dollars(self.before), dollars(self.after)),
        };
        write!(
            f,
            "{} · {}: {what} {before} → {after}",
            self.case, self.model
        )
    }
}

impl Report {
    /// The cases that got worse than in `baseline`, beyond this report's
    /// thresholds, in this report's order. A case or model only one of them has
    /// is not compared ([`Report::compared_with`] counts those that are).
    pub fn regressions(&self, baseline: &Report) -> Vec<Regression> {
        let limits = &self.thresholds;
        let mut found = Vec::new();
        for cell in &self.cells {
            let Some(before) = baseline
                .cells
                .iter()
                .find(|old| old.case == cell.case && old.model == cell.model)
            else {
                continue;
            };
            let mut flag = |metric, before: f64, after: f64| {
                found.push(Regression {
                    case: cell.case.clone(),
                    model: cell.model.clone(),
                    metric,
                    before,
                    after,
                })
            };
            // A hair of slack for figures that went through rounding.
            const EPSILON: f64 = 1e-9;
            if cell.pass_rate < before.pass_rate - limits.pass_rate - EPSILON {
                flag(Metric::PassRate, before.pass_rate, cell.pass_rate);
            }
            if cell.mean_score < before.mean_score - limits.score - EPSILON {
                flag(Metric::Score, before.mean_score, cell.mean_score);
            }
            if cell.cost_usd > before.cost_usd * (1.0 + limits.cost) + EPSILON {
                flag(Metric::Cost, before.cost_usd, cell.cost_usd);
            }
        }
        found
    }

    /// How many of this report's cells (case and model) `baseline` has too.
    pub fn compared_with(&self, baseline: &Report) -> usize {
        self.cells
            .iter()
            .filter(|cell| {
                baseline
                    .cells
                    .iter()
                    .any(|old| old.case == cell.case && old.model == cell.model)
            })
            .count()
    }

    /// The report as a table of cases × models, a line of totals, and a line
    /// for each run that failed saying why.
    pub fn table(&self) -> String {
        let header = ["case", "model", "passed", "score", "cost", "p50", "p95"];
        let rows: Vec<[String; 7]> = self
            .cells
            .iter()
            .map(|cell| {
                [
                    cell.case.clone(),
                    cell.model.clone(),
                    format!("{}/{}", cell.passed, cell.runs.len()),
                    format!("{:.2}", cell.mean_score),
                    dollars(cell.cost_usd),
                    millis(cell.latency_p50_ms),
                    millis(cell.latency_p95_ms),
                ]
            })
            .collect();
        let mut widths = header.map(str::len);
        for row in &rows {
            for (width, field) in widths.iter_mut().zip(row) {
                *width = (*width).max(field.chars().count());
            }
        }
        let mut table = String::new();
        let mut line = |fields: &[&str]| {
            let mut text = String::new();
            for (at, (field, width)) in fields.iter().zip(widths).enumerate() {
                let pad = width - field.chars().count();
                // Names to the left, figures to the right.
                if at < 2 {
                    text.push_str(field);
                    text.push_str(&" ".repeat(pad));
                } else {
                    text.push_str(&" ".repeat(pad));
                    text.push_str(field);
                }
                text.push_str("  ");
            }
            table.push_str(text.trim_end());
            table.push('\n');
        };
        line(&header);
        for row in &rows {
            line(&row.each_ref().map(String::as_str));
        }
        let _ = writeln!(
            table,
            "{} of {} runs passed ({}, run {})",
            self.passed, self.runs, self.suite, self.run
        );
        for cell in &self.cells {
            for (rep, run) in cell.runs.iter().enumerate().filter(|(_, run)| !run.passed) {
                let _ = writeln!(
                    table,
                    "failed: {} · {} #{rep} (session {}): {}",
                    cell.case,
                    cell.model,
                    run.session,
                    run.failures.join("; ")
                );
            }
        }
        table
    }

    /// The report as JUnit XML: a test suite per model, a test case per run.
    pub fn junit(&self) -> String {
        let mut xml = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
        let _ = writeln!(
            xml,
            "<testsuites name=\"{}\" tests=\"{}\" failures=\"{}\">",
            escaped(&self.suite),
            self.runs,
            self.runs - self.passed
        );
        for model in &self.models {
            let cells: Vec<&Cell> = self.cells.iter().filter(|c| &c.model == model).collect();
            let runs: usize = cells.iter().map(|cell| cell.runs.len()).sum();
            let failed: usize = cells
                .iter()
                .map(|cell| cell.runs.len() - cell.passed as usize)
                .sum();
            let _ = writeln!(
                xml,
                "  <testsuite name=\"{}\" tests=\"{runs}\" failures=\"{failed}\">",
                escaped(model)
            );
            for cell in cells {
                for (rep, run) in cell.runs.iter().enumerate() {
                    let _ = write!(
                        xml,
                        "    <testcase classname=\"{}\" name=\"{}#{rep}\" time=\"{:.3}\"",
                        escaped(model),
                        escaped(&cell.case),
                        run.latency_ms as f64 / 1000.0
                    );
                    if run.passed {
                        xml.push_str("/>\n");
                        continue;
                    }
                    let message = run.failures.join("; ");
                    let _ = writeln!(
                        xml,
                        ">\n      <failure message=\"{}\">session {}</failure>\n    </testcase>",
                        escaped(&message),
                        escaped(&run.session)
                    );
                }
            }
            xml.push_str("  </testsuite>\n");
        }
        xml.push_str("</testsuites>\n");
        xml
    }
}

fn percent(share: f64) -> String {
    format!("{:.0}%", share * 100.0)
}

fn dollars(cost: f64) -> String {
    format!("${cost:.4}")
}

fn millis(ms: u64) -> String {
    format!("{ms} ms")
}

/// `text` with XML's special characters escaped, for attributes and text.
fn escaped(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // Control characters XML 1.0 cannot carry.
            c if c.is_control() && !matches!(c, '\n' | '\t' | '\r') => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(passed: bool, score: f64, cost: f64, ms: u64) -> RunReport {
        RunReport {
            session: "eval-r.a.m.0".into(),
            passed,
            score,
            turns: 1,
            cost_usd: cost,
            latency_ms: ms,
            failures: if passed {
                vec![]
            } else {
                vec!["no <b> & \"c\"".into()]
            },
        }
    }

    fn report(cells: Vec<Cell>) -> Report {
        Report {
            suite: "s".into(),
            run: "r".into(),
            models: vec!["m".into()],
            thresholds: Thresholds::default(),
            complete: true,
            passed: cells.iter().map(|c| c.passed as usize).sum(),
            runs: cells.iter().map(|c| c.runs.len()).sum(),
            cells,
        }
    }

    #[test]
    fn a_cell_sums_its_runs() {
        let cell = Cell::of(
            "a",
            "m",
            vec![
                run(true, 1.0, 0.01, 30),
                run(false, 0.5, 0.02, 10),
                run(true, 1.0, 0.03, 20),
            ],
        );
        assert_eq!(
            (cell.passed, cell.pass_rate, cell.mean_score, cell.cost_usd),
            (2, 0.6667, 0.8333, 0.02)
        );
        assert_eq!((cell.latency_p50_ms, cell.latency_p95_ms), (20, 30));
    }

    #[test]
    fn a_baseline_flags_what_got_worse_beyond_the_thresholds() {
        let before = report(vec![
            Cell::of("a", "m", vec![run(true, 1.0, 0.010, 1)]),
            Cell::of("b", "m", vec![run(true, 0.9, 0.010, 1)]),
            Cell::of("c", "m", vec![run(true, 0.9, 0.010, 1)]),
        ]);
        let after = report(vec![
            Cell::of("a", "m", vec![run(false, 0.5, 0.010, 1)]),
            // Within the thresholds: 0.04 less, 10% more.
            Cell::of("b", "m", vec![run(true, 0.86, 0.011, 1)]),
            Cell::of("c", "m", vec![run(true, 0.9, 0.012, 1)]),
            Cell::of("new", "m", vec![run(false, 0.0, 0.0, 1)]),
        ]);
        let found: Vec<String> = after
            .regressions(&before)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            found,
            [
                "a · m: pass rate 100% → 0%",
                "a · m: score 1.00 → 0.50",
                "c · m: cost $0.0100 → $0.0120"
            ]
        );
    }

    #[test]
    fn the_table_and_junit_show_every_run() {
        let report = report(vec![Cell::of(
            "a<1>",
            "m",
            vec![run(true, 1.0, 0.0, 1500), run(false, 0.0, 0.0, 250)],
        )]);
        assert_eq!(
            report.table(),
            "case  model  passed  score     cost     p50      p95\n\
             a<1>  m         1/2   0.50  $0.0000  250 ms  1500 ms\n\
             1 of 2 runs passed (s, run r)\n\
             failed: a<1> · m #1 (session eval-r.a.m.0): no <b> & \"c\"\n"
        );
        assert_eq!(
            report.junit(),
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
             <testsuites name=\"s\" tests=\"2\" failures=\"1\">\n  \
             <testsuite name=\"m\" tests=\"2\" failures=\"1\">\n    \
             <testcase classname=\"m\" name=\"a&lt;1&gt;#0\" time=\"1.500\"/>\n    \
             <testcase classname=\"m\" name=\"a&lt;1&gt;#1\" time=\"0.250\">\n      \
             <failure message=\"no &lt;b&gt; &amp; &quot;c&quot;\">session eval-r.a.m.0</failure>\n    \
             </testcase>\n  \
             </testsuite>\n\
             </testsuites>\n"
        );
    }
}
