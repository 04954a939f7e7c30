//! `tiller-fuzz [--inputs N] [--seed S] [TARGET...]`: runs each target (all by
//! default) on its corpus, then on mutations of it, N inputs in all per target;
//! exits 1 if any input made a target fail, after saving it under
//! `target/fuzz-failures/`.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use tiller_fuzz::mutate::{Rng, mutate};
use tiller_fuzz::targets::ALL;

fn main() -> ExitCode {
    let mut inputs = 20_000usize;
    let mut seed = 0x7111_3e55u64;
    let mut chosen = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--inputs" => inputs = args.next().and_then(|v| v.parse().ok()).unwrap_or(inputs),
            "--seed" => seed = args.next().and_then(|v| v.parse().ok()).unwrap_or(seed),
            name => chosen.push(name.to_owned()),
        }
    }
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let failures_dir = here.join("../../target/fuzz-failures");
    // The decoders' own panics are what is counted; keep their messages short.
    std::panic::set_hook(Box::new(|info| eprintln!("  panic: {info}")));
    let mut failed = 0;
    let mut total = 0;
    for (name, target) in ALL {
        if !chosen.is_empty() && !chosen.iter().any(|c| c == name) {
            continue;
        }
        let corpus = read_corpus(&here.join("corpus").join(name));
        let started = Instant::now();
        let mut rng = Rng::new(seed ^ name.len() as u64);
        let mut target_failed = 0;
        for index in 0..inputs {
            let input = if index < corpus.len() {
                corpus[index].clone()
            } else {
                let base = &corpus[rng.below(corpus.len())];
                let other = &corpus[rng.below(corpus.len())];
                mutate(base, other, &mut rng)
            };
            if catch_unwind(AssertUnwindSafe(|| target(&input))).is_err() {
                target_failed += 1;
                save(&failures_dir, name, index, &input);
            }
        }
        println!(
            "{name}: {inputs} inputs ({} seeds), {target_failed} failed, {:.1} s",
            corpus.len(),
            started.elapsed().as_secs_f64()
        );
        failed += target_failed;
        total += inputs;
    }
    println!("fuzz: {total} inputs, {failed} failed");
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The seeds of one target, in name order; at least one (empty) input.
fn read_corpus(folder: &Path) -> Vec<Vec<u8>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(folder)
        .map(|entries| entries.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    paths.sort();
    let mut corpus: Vec<Vec<u8>> = paths.iter().filter_map(|p| std::fs::read(p).ok()).collect();
    if corpus.is_empty() {
        corpus.push(Vec::new());
    }
    corpus
}

fn save(folder: &Path, name: &str, index: usize, input: &[u8]) {
    let path = folder.join(format!("{name}-{index}"));
    let saved = std::fs::create_dir_all(folder).and_then(|()| std::fs::write(&path, input));
    match saved {
        Ok(()) => eprintln!("{name}: input {index} failed; saved to {}", path.display()),
        Err(error) => eprintln!("{name}: input {index} failed; could not save it: {error}"),
    }
}
