//! The workload Tiller's benchmarks share: a run of three model calls and two tool
//! rounds on the scripted `faux` model, a 10-message transcript, and the CPU clock
//! and resident set they are measured by.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tiller_ai::faux::{FauxProvider, FauxTurn};
use tiller_ai::{AssistantContent, AssistantMessage, Message, Model, TextContent};
use tiller_core::{AgentMessage, AgentTool, FnTool, ToolOutput, ToolSet};

/// A scripted model that calls `add` twice, one call per turn, then answers.
pub fn two_tool_rounds() -> FauxProvider {
    let faux = FauxProvider::new();
    faux.respond_with(|request| {
        let results = request
            .context
            .messages
            .iter()
            .filter(|m| matches!(m, Message::ToolResult(_)))
            .count();
        match results {
            0 => FauxTurn::tool_call("add", json!({"a": 2, "b": 3})).chunk_size(8),
            1 => FauxTurn::tool_call("add", json!({"a": 5, "b": 8})).chunk_size(8),
            _ => FauxTurn::text("The answer is 13, after two additions.").chunk_size(8),
        }
    });
    faux
}

/// The `add` tool [`two_tool_rounds`] calls.
pub fn add_tool() -> ToolSet {
    let add = FnTool::new(
        "add",
        "Add two integers",
        json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}),
        |args, _| async move {
            let sum: i64 = ["a", "b"].iter().filter_map(|k| args[k].as_i64()).sum();
            Ok(ToolOutput::text(sum.to_string()))
        },
    );
    ToolSet::new([Arc::new(add) as Arc<dyn AgentTool>]).unwrap()
}

/// CPU time (user and system) of this process so far.
#[allow(unsafe_code)]
pub fn cpu_time() -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given; RUSAGE_SELF is always valid.
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
        usage.assume_init()
    };
    let time = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// The system's monotonic clock (`CLOCK_MONOTONIC`) in nanoseconds: the same
/// clock in every process of the machine, so a time taken in one can be compared
/// with one taken in another.
#[allow(unsafe_code)]
pub fn monotonic_ns() -> u64 {
    let mut now = std::mem::MaybeUninit::<libc::timespec>::zeroed();
    // SAFETY: clock_gettime fills the struct it is given; CLOCK_MONOTONIC is
    // always available on Linux.
    let now = unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, now.as_mut_ptr());
        now.assume_init()
    };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

/// The runtimes the benches print each figure for, by name: tokio's
/// multi-thread runtime with two workers (this machine's cores) and its
/// current-thread runtime, I/O and time enabled.
pub fn runtimes() -> [(&'static str, tokio::runtime::Builder); 2] {
    let mut multi = tokio::runtime::Builder::new_multi_thread();
    multi.worker_threads(2).enable_all();
    let mut current = tokio::runtime::Builder::new_current_thread();
    current.enable_all();
    [("multi-thread", multi), ("current-thread", current)]
}

/// Runs `future` to its end on a current-thread runtime of its own (I/O and
/// time enabled), as the benches' floors are measured.
pub fn on_current_thread<F: std::future::Future>(future: F) -> F::Output {
    let [_, (_, mut current)] = runtimes();
    current.build().unwrap().block_on(future)
}

/// The process's resident set, in bytes.
pub fn rss() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    statm
        .split_whitespace()
        .nth(1)
        .and_then(|pages| pages.parse::<usize>().ok())
        .unwrap_or(0)
        * 4096
}

/// The machine's CPU time so far as Linux counts it in `/proc/stat` (in its
/// ticks): all of it, and the part stolen, that a hypervisor gave to other
/// machines while this one had work. A figure timed while much was stolen says
/// more about the host than about the code. Zero without `/proc/stat`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuTicks {
    /// Every tick of every CPU (idle and stolen included).
    pub total: u64,
    /// The stolen ticks.
    pub stolen: u64,
    /// The idle ticks (waiting for I/O included).
    pub idle: u64,
}

impl CpuTicks {
    /// The counts now.
    pub fn now() -> Self {
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        // `cpu  user nice system idle iowait irq softirq steal guest guest_nice`;
        // the guest times are counted in user and nice already.
        let ticks: Vec<u64> = stat
            .lines()
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .skip(1)
            .take(8)
            .filter_map(|field| field.parse().ok())
            .collect();
        CpuTicks {
            total: ticks.iter().sum(),
            stolen: ticks.get(7).copied().unwrap_or(0),
            idle: ticks.get(3).copied().unwrap_or(0) + ticks.get(4).copied().unwrap_or(0),
        }
    }

    /// The percentage of the machine's CPU time since `earlier` that was busy
    /// (neither idle nor waiting for I/O).
    pub fn busy_since(self, earlier: CpuTicks) -> f64 {
        self.percent_since(earlier, |ticks| ticks.idle)
            .map_or(0.0, |idle| 100.0 - idle)
    }

    /// The percentage of the machine's CPU time since `earlier` that was stolen.
    pub fn stolen_since(self, earlier: CpuTicks) -> f64 {
        self.percent_since(earlier, |ticks| ticks.stolen)
            .unwrap_or(0.0)
    }

    /// The percentage of the CPU time since `earlier` that `part` counts; none
    /// when no time passed.
    fn percent_since(self, earlier: CpuTicks, part: impl Fn(CpuTicks) -> u64) -> Option<f64> {
        let total = self.total.saturating_sub(earlier.total);
        let part = part(self).saturating_sub(part(earlier));
        (total > 0).then(|| part as f64 * 100.0 / total as f64)
    }
}

/// Five questions and five answers, as a model would have written them.
pub fn transcript(model: &Model) -> Vec<AgentMessage> {
    (0..5)
        .flat_map(|n| {
            let mut answer = AssistantMessage::empty(model);
            answer
                .content
                .push(AssistantContent::Text(TextContent::new(format!(
                    "Answer number {n}, short and to the point."
                ))));
            [
                AgentMessage::user(format!("Question number {n}?")),
                AgentMessage::Llm(Message::from(answer)),
            ]
        })
        .collect()
}
