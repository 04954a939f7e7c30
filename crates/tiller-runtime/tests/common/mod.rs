//! The agent tests' kit: the shared one (`tiller_test_support`), and the tools
//! these tests name.

#![allow(dead_code, clippy::unwrap_used)]

// Each test uses some of it.
#[allow(unused_imports)]
pub(crate) use tiller_test_support::runtime::{
    agent, endless, idle, is_agent_end, is_restart, last_user, panicking_once, run_ends,
    tool_started, until,
};
#[allow(unused_imports)]
pub(crate) use tiller_test_support::tools::{log, logged, patient, remind, tools};
#[allow(unused_imports)]
pub(crate) use tiller_test_support::transcript::{assert_valid, roles};

use std::sync::Arc;

use tiller::AgentTool;

/// An `echo` tool (see [`tiller_test_support::tools::echo`]) whose log no test
/// reads.
pub(crate) fn echo() -> Arc<dyn AgentTool> {
    tiller_test_support::tools::echo(&log())
}
