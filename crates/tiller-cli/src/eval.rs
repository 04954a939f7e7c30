//! `tiller eval`: a suite's runs, their table, and what got worse than a
//! baseline.

use std::io::{IsTerminal, Write as _};
use std::path::Path;

use tiller::eval::{EvalError, Evaluation, Report, Suite};
use tiller::{Supervisor, SupervisorConfig};

use crate::cli::EvalArgs;
use crate::outcome::Exit;
use crate::sessions::open_store;

/// Runs the suite `args` names and answers the exit status (see `tiller eval
/// --help`).
pub async fn eval(args: &EvalArgs) -> Exit {
    let suite = match Suite::load(&args.suite) {
        Ok(suite) => suite,
        Err(error) => return Exit::usage(error),
    };
    let baseline = match args.baseline.as_deref().map(read_report).transpose() {
        Ok(baseline) => baseline,
        Err(error) => return Exit::usage(error),
    };
    if let Some(baseline) = baseline.as_ref().filter(|b| b.suite != suite.name) {
        return Exit::usage(format!(
            "--baseline is a report of the suite `{}`, not of `{}`",
            baseline.suite, suite.name
        ));
    }
    // The output files, made before any run spends anything.
    let mut outputs = Vec::new();
    for (path, form) in [(&args.json, Form::Json), (&args.junit, Form::Junit)] {
        let Some(path) = path else { continue };
        match std::fs::File::create(path) {
            Ok(file) => outputs.push((path, file, form)),
            Err(error) => return Exit::usage(format!("cannot write {}: {error}", path.display())),
        }
    }
    let store = match open_store(args.store.as_deref()).await {
        Ok(store) => store,
        Err(exit) => return exit,
    };
    let supervisor = match Supervisor::with_store(SupervisorConfig::default(), store).await {
        Ok(supervisor) => supervisor,
        Err(error) => return Exit::failed(error),
    };
    let mut evaluation = Evaluation::new(&suite);
    if let Some(run) = &args.run {
        evaluation = evaluation.with_run(run.clone());
    }
    // A live line on a terminal; nothing between the table's lines otherwise.
    if std::io::stderr().is_terminal() {
        evaluation = evaluation.on_progress(|progress| {
            crate::say_part!(
                "\r[{}/{}] {} passed, {} failed ",
                progress.done,
                progress.total,
                progress.passed,
                progress.done - progress.passed
            );
            if progress.done == progress.total {
                crate::say!("");
            }
        });
    }
    let run = evaluation.run_id().to_owned();
    let report = evaluation.run(&supervisor).await;
    supervisor.shutdown().await;
    let report = match report {
        Ok(report) => report,
        Err(error @ EvalError::Store(_)) => return Exit::failed(error),
        Err(error) => return Exit::usage(error),
    };
    print!("{}", report.table());
    crate::say!(
        "tiller: the runs' sessions belong to the tenant eval-{run} (`tiller sessions rm --tenant eval-{run}` deletes them)"
    );
    for (path, mut file, form) in outputs {
        let text = match form {
            Form::Json => serde_json::to_string_pretty(&report).map(|json| json + "\n"),
            Form::Junit => Ok(report.junit()),
        };
        let written = text
            .map_err(std::io::Error::other)
            .and_then(|text| file.write_all(text.as_bytes()));
        if let Err(error) = written {
            return Exit::failed(format!("cannot write {}: {error}", path.display()));
        }
    }
    if !report.complete {
        crate::say!("tiller: the suite's budget ran out before every run was made");
    }
    match baseline {
        Some(_) if !report.complete => {
            println!("not compared with the baseline: some runs were not made");
            Exit::Failed
        }
        Some(baseline) if report.compared_with(&baseline) == 0 => {
            println!(
                "no case and model of run {} is in this run: nothing compared",
                baseline.run
            );
            Exit::Failed
        }
        Some(baseline) => {
            let worse = report.regressions(&baseline);
            if worse.is_empty() {
                println!("no case got worse than in run {}", baseline.run);
                return Exit::Success;
            }
            println!("worse than in run {}:", baseline.run);
            for regression in &worse {
                println!("  {regression}");
            }
            Exit::Failed
        }
        None if report.passed == report.runs => Exit::Success,
        None => Exit::Failed,
    }
}

/// What an output file holds.
#[derive(Clone, Copy)]
enum Form {
    Json,
    Junit,
}

/// The report a `--json` file holds.
fn read_report(path: &Path) -> Result<Report, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|error| format!("--baseline {}: {error}", path.display()))?;
    serde_json::from_str(&text)
        .map_err(|error| format!("--baseline {}: not a report: {error}", path.display()))
}
