//! Budgets: how much a run, an agent or a tenant may spend.
//!
//! A [`Budget`] bounds tokens (input, output, total), cost in US dollars (as the
//! model's prices reckon it), model calls (responses; see [`Spent::response`]),
//! tool calls and wall-clock time; a
//! bound left `None` is no bound. A run checks its budgets before each model call
//! and before each batch of tool calls: past any of them it ends with
//! [`RunEnd::BudgetExceeded`](crate::RunEnd::BudgetExceeded), after a
//! `budget_exceeded` event naming the scope, the bound, its maximum and what was
//! spent. A model call or a tool under way finishes first; a batch of tool calls
//! the budget does not cover is answered as not run, whole; steering and
//! follow-ups taken for a turn that will not come go back to their queues.
//!
//! A model call is a reservation: before it goes out, its most (the request's
//! counted input, the output its `max_tokens` allows, one call, priced) is held
//! against the run's, the agent's and the tenant's budgets at once, the tenant's
//! under its tally's lock, so that concurrent runs cannot all pass one check and
//! overspend together. Where a bound on output, total tokens or cost leaves less
//! room than the call's limit, the call's `max_tokens` is lowered to the room
//! (and its thinking turned off if that would go past it); with no room, or no
//! call left, it is refused. When the response ends, the hold becomes what it
//! used. The input is the count compaction keeps (the provider's for what it
//! answered before, four bytes a token for the rest): a provider counting more
//! than that is the one way past a token budget.
//!
//! The run's own budget ([`Budgets::run`]) counts this run; the agent's
//! ([`Budgets::agent`]) counts every run of the agent's session, the runs before
//! this one given by [`Spending::agent_before`] (hosts read it from their store);
//! the tenant's counts every run of its agents through a shared [`Tally`].
//!
//! Where several processes spend one tenant's budget (the hosts of a cluster on
//! one PostgreSQL), a tally kept in memory would let each spend all of it: a
//! [`Tally::shared`] keeps its holds and spending in a [`TenantLedger`] (the
//! store of record), each model call held there in one step every process
//! sees, its spending written when it settles. No process can then overspend.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use tiller_ai::{AssistantMessage, Model, ModelCost, StopReason, StreamOptions, Usage};

/// Bounds on what may be spent; `None` is no bound.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Budget {
    /// Input tokens (cached ones included).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input_tokens: Option<u64>,
    /// Output tokens.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_tokens: Option<u64>,
    /// Input and output tokens together.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_tokens: Option<u64>,
    /// Cost in US dollars, as the model's prices reckon it (a finite number, at
    /// least 0).
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "dollars")]
    pub cost_usd: Option<f64>,
    /// Model calls.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_calls: Option<u64>,
    /// Tool calls the model made, each counted once it is answered (run,
    /// refused or failed); a batch that would go past it is refused whole.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<u64>,
    /// Wall-clock time of runs, in milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wall_clock_ms: Option<u64>,
}

impl Budget {
    /// Whether it bounds nothing.
    pub fn is_unbounded(&self) -> bool {
        *self == Budget::default()
    }

    /// Its bound on `limit`, if it has one.
    pub fn bound(&self, limit: BudgetLimit) -> Option<Amount> {
        let count = match limit {
            BudgetLimit::InputTokens => self.input_tokens,
            BudgetLimit::OutputTokens => self.output_tokens,
            BudgetLimit::TotalTokens => self.total_tokens,
            BudgetLimit::CostUsd => return self.cost_usd.map(Amount::Dollars),
            BudgetLimit::ModelCalls => self.model_calls,
            BudgetLimit::ToolCalls => self.tool_calls,
            BudgetLimit::WallClockMs => self.wall_clock_ms,
        };
        count.map(Amount::Count)
    }

    /// The first bound `spent` leaves no room under, with its maximum and what was
    /// spent; `None` while there is room. Tokens, cost, model calls and time have
    /// no room left once they reach their bound (the next model call would go
    /// past it); tool calls, counted with the batch about to run, once they go
    /// past it. The counts are looked at before the cost.
    pub fn exceeded_by(&self, spent: &Spent) -> Option<(BudgetLimit, Amount, Amount)> {
        const IN_ORDER: [BudgetLimit; 7] = [
            BudgetLimit::InputTokens,
            BudgetLimit::OutputTokens,
            BudgetLimit::TotalTokens,
            BudgetLimit::ModelCalls,
            BudgetLimit::ToolCalls,
            BudgetLimit::WallClockMs,
            BudgetLimit::CostUsd,
        ];
        IN_ORDER.into_iter().find_map(|limit| {
            let max = self.bound(limit)?;
            let spent = spent.amount(limit);
            let reached = match (max, spent) {
                (Amount::Count(max), Amount::Count(spent)) if limit == BudgetLimit::ToolCalls => {
                    spent > max
                }
                (Amount::Count(max), Amount::Count(spent)) => spent >= max,
                (max, spent) => spent.value() >= max.value(),
            };
            reached.then_some((limit, max, spent))
        })
    }

    /// The room `spent` leaves for one more model call of `input` tokens priced
    /// at `prices`: the most output tokens it may use (`None`: no bound on
    /// them), or the bound that leaves none, with its maximum and what was spent.
    pub fn room(
        &self,
        spent: &Spent,
        input: u64,
        prices: &ModelCost,
    ) -> Result<Option<u64>, (BudgetLimit, Amount, Amount)> {
        // The call before any output: its input and one call, priced.
        let after = spent.plus(&Spent::at_most(input, 0, prices));
        for limit in [
            BudgetLimit::ModelCalls,
            BudgetLimit::InputTokens,
            BudgetLimit::TotalTokens,
            BudgetLimit::CostUsd,
            BudgetLimit::WallClockMs,
        ] {
            let Some(max) = self.bound(limit) else {
                continue;
            };
            let past = match limit {
                BudgetLimit::WallClockMs => spent.amount(limit).value() >= max.value(),
                _ => after.amount(limit).value() > max.value(),
            };
            if past {
                return Err((limit, max, spent.amount(limit)));
            }
        }
        let mut room: Option<(u64, BudgetLimit)> = None;
        let mut narrow = |tokens: u64, limit| {
            if room.is_none_or(|(most, _)| tokens < most) {
                room = Some((tokens, limit));
            }
        };
        if let Some(max) = self.output_tokens {
            narrow(
                max.saturating_sub(spent.output_tokens),
                BudgetLimit::OutputTokens,
            );
        }
        if let Some(max) = self.total_tokens {
            narrow(
                max.saturating_sub(after.total_tokens()),
                BudgetLimit::TotalTokens,
            );
        }
        if let Some(max) = self.cost_usd
            && prices.output > 0.0
        {
            let dollars = (max - after.cost_usd).max(0.0);
            narrow((dollars * 1e6 / prices.output) as u64, BudgetLimit::CostUsd);
        }
        match room {
            Some((0, limit)) => Err((
                limit,
                self.bound(limit).unwrap_or(Amount::Count(0)),
                spent.amount(limit),
            )),
            room => Ok(room.map(|(most, _)| most)),
        }
    }
}

/// A dollar bound: finite, at least 0.
fn dollars<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<f64>, D::Error> {
    let dollars = Option::<f64>::deserialize(deserializer)?;
    match dollars {
        Some(value) if !value.is_finite() || value < 0.0 => Err(serde::de::Error::invalid_value(
            serde::de::Unexpected::Float(value),
            &"a number of dollars, at least 0",
        )),
        dollars => Ok(dollars),
    }
}

/// A run's and its agent's budgets, as settings and agent files state them
/// (`budget: {run: {...}, agent: {...}}`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Budgets {
    /// What one run may spend.
    #[serde(skip_serializing_if = "Budget::is_unbounded")]
    pub run: Budget,
    /// What the agent's session may spend over all its runs.
    #[serde(skip_serializing_if = "Budget::is_unbounded")]
    pub agent: Budget,
}

impl Budgets {
    /// Whether neither bounds anything.
    pub fn is_unbounded(&self) -> bool {
        self.run.is_unbounded() && self.agent.is_unbounded()
    }
}

/// What was spent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Spent {
    /// Input tokens (cached ones included).
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// US dollars.
    pub cost_usd: f64,
    /// Model calls.
    pub model_calls: u64,
    /// Tool calls.
    pub tool_calls: u64,
    /// Wall-clock milliseconds of runs.
    pub wall_clock_ms: u64,
}

impl Spent {
    /// Input and output tokens together.
    pub fn total_tokens(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }

    /// What it spent on `limit`.
    pub fn amount(&self, limit: BudgetLimit) -> Amount {
        Amount::Count(match limit {
            BudgetLimit::InputTokens => self.input_tokens,
            BudgetLimit::OutputTokens => self.output_tokens,
            BudgetLimit::TotalTokens => self.total_tokens(),
            BudgetLimit::CostUsd => return Amount::Dollars(self.cost_usd),
            BudgetLimit::ModelCalls => self.model_calls,
            BudgetLimit::ToolCalls => self.tool_calls,
            BudgetLimit::WallClockMs => self.wall_clock_ms,
        })
    }

    /// One model call and what its response used.
    pub fn model_call(usage: &Usage) -> Self {
        Spent {
            input_tokens: usage.prompt_tokens(),
            output_tokens: usage.output,
            cost_usd: usage.cost.total,
            model_calls: 1,
            ..Spent::default()
        }
    }

    /// What a response cost: its tokens and dollars, and one model call unless
    /// it failed or was aborted without using a token (a request refused, a
    /// server down: nothing was spent, and a fallback may answer in its place).
    pub fn response(message: &AssistantMessage) -> Self {
        let mut spent = Spent::model_call(&message.usage);
        let failed = matches!(message.stop_reason, StopReason::Error | StopReason::Aborted);
        if failed && spent.total_tokens() == 0 {
            spent.model_calls = 0;
        }
        spent
    }

    /// `calls` tool calls.
    pub fn tool_calls(calls: u64) -> Self {
        Spent {
            tool_calls: calls,
            ..Spent::default()
        }
    }

    /// `ms` milliseconds of a run.
    pub fn wall_clock(ms: u64) -> Self {
        Spent {
            wall_clock_ms: ms,
            ..Spent::default()
        }
    }

    /// Both together.
    pub fn plus(mut self, other: &Spent) -> Self {
        self += other;
        self
    }

    /// Whether nothing was spent.
    pub fn is_zero(&self) -> bool {
        *self == Spent::default()
    }

    /// `other` taken off, never below nothing.
    pub fn minus(&self, other: &Spent) -> Self {
        Spent {
            input_tokens: self.input_tokens.saturating_sub(other.input_tokens),
            output_tokens: self.output_tokens.saturating_sub(other.output_tokens),
            cost_usd: (self.cost_usd - other.cost_usd).max(0.0),
            model_calls: self.model_calls.saturating_sub(other.model_calls),
            tool_calls: self.tool_calls.saturating_sub(other.tool_calls),
            wall_clock_ms: self.wall_clock_ms.saturating_sub(other.wall_clock_ms),
        }
    }

    /// The most one model call of `input` tokens and at most `output` tokens
    /// may spend at `prices` (cache writes, where they cost more, for the input).
    pub fn at_most(input: u64, output: u64, prices: &ModelCost) -> Self {
        Spent {
            input_tokens: input,
            output_tokens: output,
            cost_usd: (input as f64 * prices.input.max(prices.cache_write)
                + output as f64 * prices.output)
                / 1e6,
            model_calls: 1,
            ..Spent::default()
        }
    }
}

impl std::ops::AddAssign<&Spent> for Spent {
    fn add_assign(&mut self, other: &Spent) {
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.cost_usd += other.cost_usd;
        self.model_calls = self.model_calls.saturating_add(other.model_calls);
        self.tool_calls = self.tool_calls.saturating_add(other.tool_calls);
        self.wall_clock_ms = self.wall_clock_ms.saturating_add(other.wall_clock_ms);
    }
}

/// A running total shared by many runs (a tenant's agents), with its budget and
/// what the model calls under way hold against it.
#[derive(Default)]
pub struct Tally {
    state: Mutex<TallyState>,
    /// Where the holds and spending live when other processes share them.
    ledger: Option<(Arc<str>, Arc<dyn TenantLedger>)>,
}

impl std::fmt::Debug for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tally")
            .field("state", &*self.lock())
            .field("shared", &self.ledger.is_some())
            .finish()
    }
}

#[derive(Debug, Default)]
struct TallyState {
    budget: Budget,
    spent: Spent,
    /// The most the calls under way may still spend (see [`Tally::reserve`]).
    held: Spent,
}

/// Where one tenant's holds and spending are kept for every process that
/// spends its budget: the store of record of a cluster. Each step is one
/// transaction there; an error is the store's, and the caller tries again.
pub trait TenantLedger: Send + Sync {
    /// Holds one model call of `input` tokens and at most `output` tokens at
    /// `prices` for `tenant`, against `budget` with what every process spent
    /// and holds, in one step.
    fn reserve<'a>(
        &'a self,
        tenant: &'a str,
        budget: &'a Budget,
        input: u64,
        output: u64,
        prices: &'a ModelCost,
    ) -> BoxFuture<'a, Result<Reserved, String>>;

    /// Ends the hold `id`: `used` is spent, the rest of it free again.
    fn settle<'a>(
        &'a self,
        tenant: &'a str,
        id: &'a str,
        used: &'a Spent,
    ) -> BoxFuture<'a, Result<(), String>>;

    /// Adds to what `tenant` spent (tool calls, wall clock), once for `id`
    /// however often it is tried.
    fn add<'a>(
        &'a self,
        tenant: &'a str,
        id: &'a str,
        spent: &'a Spent,
    ) -> BoxFuture<'a, Result<(), String>>;
}

/// What a [`TenantLedger`] made of a reservation.
#[derive(Debug, Clone, PartialEq)]
pub enum Reserved {
    /// Held as `hold` under `id`; every process had spent `spent` (the holds
    /// under way apart).
    Held {
        /// The hold's id, to settle it by.
        id: String,
        /// What it holds.
        hold: Spent,
        /// What the tenant had spent, as the ledger counts it.
        spent: Spent,
    },
    /// The budget's bound that leaves no room, its maximum and what was taken.
    Refused(BudgetLimit, Amount, Amount),
}

/// A model call's hold on a [`Tally`], from [`Tally::hold`] to
/// [`Tally::release`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CallHold {
    /// The most the call may spend.
    pub spent: Spent,
    /// Its id in the tally's ledger, when the tally is shared.
    pub id: Option<String>,
}

/// The first wait before a ledger step is tried again, and the longest.
const LEDGER_RETRY: (Duration, Duration) = (Duration::from_millis(20), Duration::from_secs(2));

/// `step` until the ledger takes it: a store that is down holds the call (as it
/// holds every write), it does not let it through unreserved.
async fn until_taken<T, F>(what: &str, mut step: impl FnMut() -> F) -> T
where
    F: Future<Output = Result<T, String>>,
{
    let mut wait = LEDGER_RETRY.0;
    loop {
        match step().await {
            Ok(value) => return value,
            Err(error) => {
                tracing::warn!(%error, "a tenant's ledger did not take {what}; trying again");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(LEDGER_RETRY.1);
            }
        }
    }
}

impl Tally {
    /// A tally that starts at `spent` (what the store counted), under `budget`.
    pub fn new(budget: Budget, spent: Spent) -> Self {
        Tally {
            state: Mutex::new(TallyState {
                budget,
                spent,
                held: Spent::default(),
            }),
            ledger: None,
        }
    }

    /// A tally of `tenant` whose holds and spending `ledger` keeps for every
    /// process that shares it (see the module's doc); `spent` is what it
    /// counted so far.
    pub fn shared(
        budget: Budget,
        spent: Spent,
        tenant: &str,
        ledger: Arc<dyn TenantLedger>,
    ) -> Self {
        Tally {
            ledger: Some((Arc::from(tenant), ledger)),
            ..Tally::new(budget, spent)
        }
    }

    /// Whether a ledger keeps this tally's spending: runs then leave the
    /// tenant's part of their spending to it.
    pub fn is_shared(&self) -> bool {
        self.ledger.is_some()
    }

    /// The budget.
    pub fn budget(&self) -> Budget {
        self.lock().budget
    }

    /// Replaces the budget.
    pub fn set_budget(&self, budget: Budget) {
        self.lock().budget = budget;
    }

    /// What was spent so far (calls under way not counted until they end; of
    /// a shared tally, as its ledger last said).
    pub fn spent(&self) -> Spent {
        self.lock().spent
    }

    /// What the calls under way hold.
    pub fn held(&self) -> Spent {
        self.lock().held
    }

    /// Adds to what was spent (and, shared, to the ledger, beside the caller).
    pub fn add(&self, spent: &Spent) {
        self.lock().spent += spent;
        if let Some((tenant, ledger)) = self.ledger.clone() {
            let spent = *spent;
            let _ = spawn_beside(async move {
                let id = tiller_ai::new_id();
                until_taken("spending", || ledger.add(&tenant, &id, &spent)).await;
            });
        }
    }

    /// Holds one model call of `input` tokens and at most `output` tokens at
    /// `prices` against the budget, with what is spent and held already, in one
    /// step: the output it may use (at most `output`, less where the budget
    /// leaves less), or the bound that leaves it no room. Local: a shared
    /// tally holds through [`Tally::hold`].
    pub fn reserve(
        &self,
        input: u64,
        output: u64,
        prices: &ModelCost,
    ) -> Result<Spent, (BudgetLimit, Amount, Amount)> {
        let mut state = self.lock();
        let taken = state.spent.plus(&state.held);
        let room = state.budget.room(&taken, input, prices)?;
        let hold = Spent::at_most(input, room.map_or(output, |room| room.min(output)), prices);
        state.held += &hold;
        Ok(hold)
    }

    /// Ends a hold [`Tally::reserve`] made: `used` is spent, the rest of `hold`
    /// is free again.
    pub fn settle(&self, hold: &Spent, used: &Spent) {
        let mut state = self.lock();
        state.held = state.held.minus(hold);
        state.spent += used;
    }

    /// [`Tally::reserve`], in the ledger when the tally is shared (waiting out a
    /// store that is down).
    pub async fn hold(
        &self,
        input: u64,
        output: u64,
        prices: &ModelCost,
    ) -> Result<CallHold, (BudgetLimit, Amount, Amount)> {
        let Some((tenant, ledger)) = &self.ledger else {
            let spent = self.reserve(input, output, prices)?;
            return Ok(CallHold { spent, id: None });
        };
        let budget = self.budget();
        let reserved = until_taken("a hold", || {
            ledger.reserve(tenant, &budget, input, output, prices)
        })
        .await;
        match reserved {
            Reserved::Held { id, hold, spent } => {
                let mut state = self.lock();
                state.spent = spent;
                state.held += &hold;
                Ok(CallHold {
                    spent: hold,
                    id: Some(id),
                })
            }
            Reserved::Refused(limit, max, spent) => Err((limit, max, spent)),
        }
    }

    /// Ends a hold [`Tally::hold`] made: `used` is spent (written to the
    /// ledger, when shared, before this returns; a caller that stops waiting
    /// does not stop the write), the rest free again.
    pub async fn release(&self, hold: &CallHold, used: &Spent) {
        self.settle(&hold.spent, used);
        if let Some(written) = self.settle_in_ledger(hold, used) {
            let _ = written.await;
        }
    }

    /// [`Tally::release`] beside the caller, for a hold dropped unsettled.
    pub fn release_later(&self, hold: CallHold, used: Spent) {
        self.settle(&hold.spent, &used);
        let _ = self.settle_in_ledger(&hold, &used);
    }

    /// Settles `hold` in the ledger, when the tally is shared, on a task of its
    /// own (tried until the ledger takes it).
    fn settle_in_ledger(
        &self,
        hold: &CallHold,
        used: &Spent,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let ((tenant, ledger), id) = (self.ledger.clone()?, hold.id.clone()?);
        let used = *used;
        spawn_beside(async move {
            until_taken("a settlement", || ledger.settle(&tenant, &id, &used)).await;
        })
    }

    fn lock(&self) -> MutexGuard<'_, TallyState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Runs `work` on a task of its own on the current Tokio runtime, if there is
/// one (a ledger step its caller may stop waiting for; without a runtime, a
/// hold expires in the store).
fn spawn_beside(
    work: impl Future<Output = ()> + Send + 'static,
) -> Option<tokio::task::JoinHandle<()>> {
    let runtime = tokio::runtime::Handle::try_current().ok()?;
    Some(runtime.spawn(work))
}

/// What a run counts against besides its own spending.
#[derive(Debug, Clone, Default)]
pub struct Spending {
    /// What the agent's session spent before this run.
    pub agent_before: Spent,
    /// The tenant's shared tally, when its spending is bounded or counted.
    pub tenant: Option<Arc<Tally>>,
}

/// Whose budget ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BudgetScope {
    /// The run's own.
    Run,
    /// The agent's, over all its runs.
    Agent,
    /// The tenant's, over all its agents.
    Tenant,
}

impl BudgetScope {
    /// Its name, as JSON writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            BudgetScope::Run => "run",
            BudgetScope::Agent => "agent",
            BudgetScope::Tenant => "tenant",
        }
    }
}

/// Which bound of a budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum BudgetLimit {
    /// [`Budget::input_tokens`].
    InputTokens,
    /// [`Budget::output_tokens`].
    OutputTokens,
    /// [`Budget::total_tokens`].
    TotalTokens,
    /// [`Budget::cost_usd`].
    CostUsd,
    /// [`Budget::model_calls`].
    ModelCalls,
    /// [`Budget::tool_calls`].
    ToolCalls,
    /// [`Budget::wall_clock_ms`].
    WallClockMs,
}

impl BudgetLimit {
    /// Every bound, in the order budgets list them.
    pub const ALL: [BudgetLimit; 7] = [
        BudgetLimit::InputTokens,
        BudgetLimit::OutputTokens,
        BudgetLimit::TotalTokens,
        BudgetLimit::CostUsd,
        BudgetLimit::ModelCalls,
        BudgetLimit::ToolCalls,
        BudgetLimit::WallClockMs,
    ];

    /// Its name, as JSON and settings write it.
    pub fn as_str(self) -> &'static str {
        match self {
            BudgetLimit::InputTokens => "input_tokens",
            BudgetLimit::OutputTokens => "output_tokens",
            BudgetLimit::TotalTokens => "total_tokens",
            BudgetLimit::CostUsd => "cost_usd",
            BudgetLimit::ModelCalls => "model_calls",
            BudgetLimit::ToolCalls => "tool_calls",
            BudgetLimit::WallClockMs => "wall_clock_ms",
        }
    }
}

/// A count, or dollars.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Amount {
    /// Tokens, calls or milliseconds.
    Count(u64),
    /// US dollars.
    Dollars(f64),
}

impl Amount {
    /// The count or the dollars, as a number.
    pub fn value(self) -> f64 {
        match self {
            Amount::Count(count) => count as f64,
            Amount::Dollars(dollars) => dollars,
        }
    }
}

impl std::fmt::Display for Amount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Amount::Count(count) => write!(f, "{count}"),
            Amount::Dollars(dollars) => write!(f, "${dollars:.4}"),
        }
    }
}

/// A budget that ran out: whose, which bound, its maximum and what was spent.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, thiserror::Error)]
#[error("the {} budget of {} ran out: {spent} spent of {max}", scope.as_str(), limit.as_str())]
pub struct BudgetExceeded {
    /// Whose budget.
    pub scope: BudgetScope,
    /// Which bound.
    pub limit: BudgetLimit,
    /// The bound.
    pub max: Amount,
    /// What was spent.
    pub spent: Amount,
}

/// A model call's hold on the budgets, from [`Meter::reserve`] to
/// [`Meter::settle`]; dropped unsettled (the call never ended), it frees the
/// tenant's hold.
#[derive(Debug, Default)]
pub(crate) struct Reservation {
    /// The most the call may spend.
    hold: CallHold,
    /// The tenant's tally holding it.
    tally: Option<Arc<Tally>>,
    /// The output the call may use, when a budget leaves it less than its limit.
    pub(crate) max_tokens: Option<u32>,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(tally) = self.tally.take() {
            tally.release_later(std::mem::take(&mut self.hold), Spent::default());
        }
    }
}

impl BudgetExceeded {
    /// `scope`'s `limit` with its maximum and what was spent.
    fn of(scope: BudgetScope, (limit, max, spent): (BudgetLimit, Amount, Amount)) -> Self {
        BudgetExceeded {
            scope,
            limit,
            max,
            spent,
        }
    }
}

/// The budgets a run checks and what it spent, kept by the run.
#[derive(Debug)]
pub(crate) struct Meter {
    budgets: Budgets,
    spending: Spending,
    /// This run's spending, its wall clock apart.
    spent: Spent,
    started: tokio::time::Instant,
    /// Whether any budget bounds anything: without one, checks cost nothing.
    bounded: bool,
}

impl Meter {
    pub(crate) fn new(budgets: Budgets, spending: Spending) -> Self {
        let bounded = !budgets.is_unbounded()
            || spending
                .tenant
                .as_ref()
                .is_some_and(|tally| !tally.budget().is_unbounded());
        Meter {
            budgets,
            spending,
            spent: Spent::default(),
            started: tokio::time::Instant::now(),
            bounded,
        }
    }

    /// Counts what the run spent (and adds it to the tenant's tally).
    pub(crate) fn spend(&mut self, spent: Spent) {
        self.spent += &spent;
        if let Some(tally) = &self.spending.tenant {
            tally.add(&spent);
        }
    }

    /// Holds the most a call to `model` with `options` may spend, its input
    /// counted as `input` tokens, against the run's, the agent's and the
    /// tenant's budgets (see the module's doc): the hold, with the output the
    /// call may use when a budget leaves it less than its limit; or the budget
    /// that leaves no room.
    pub(crate) async fn reserve(
        &self,
        input: u64,
        model: &Model,
        options: &StreamOptions,
    ) -> Result<Reservation, BudgetExceeded> {
        let mut reservation = Reservation::default();
        if !self.bounded {
            return Ok(reservation);
        }
        let cap = u64::from(options.output_cap(model));
        let run = self.spent.plus(&Spent::wall_clock(self.elapsed_ms()));
        let agent = self.spending.agent_before.plus(&run);
        let mut most = cap;
        for (scope, budget, spent) in [
            (BudgetScope::Run, &self.budgets.run, &run),
            (BudgetScope::Agent, &self.budgets.agent, &agent),
        ] {
            match budget.room(spent, input, &model.cost) {
                Ok(room) => most = room.map_or(most, |room| room.min(most)),
                Err(limit) => return Err(BudgetExceeded::of(scope, limit)),
            }
        }
        reservation.hold = match &self.spending.tenant {
            Some(tally) => {
                let hold = tally
                    .hold(input, most, &model.cost)
                    .await
                    .map_err(|limit| BudgetExceeded::of(BudgetScope::Tenant, limit))?;
                reservation.tally = Some(tally.clone());
                hold
            }
            None => CallHold {
                spent: Spent::at_most(input, most, &model.cost),
                id: None,
            },
        };
        most = reservation.hold.spent.output_tokens;
        if most < cap {
            reservation.max_tokens = Some(u32::try_from(most).unwrap_or(u32::MAX));
        }
        Ok(reservation)
    }

    /// Ends `reservation` with what its call `used`: counted by the run, and by
    /// the tenant in place of the hold.
    pub(crate) async fn settle(&mut self, mut reservation: Reservation, used: Spent) {
        match reservation.tally.take() {
            Some(tally) => {
                self.spent += &used;
                tally.release(&reservation.hold, &used).await;
            }
            None => self.spend(used),
        }
    }

    /// The run's wall clock so far, in milliseconds.
    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Ends the run's wall clock: adds it to the tenant's tally.
    pub(crate) fn stop(&mut self) {
        if let Some(tally) = &self.spending.tenant {
            tally.add(&Spent::wall_clock(self.elapsed_ms()));
        }
    }

    /// The first budget past its bound, if `more` (tool calls about to run) were
    /// spent too.
    pub(crate) fn exceeded(&self, more: &Spent) -> Option<BudgetExceeded> {
        if !self.bounded {
            return None;
        }
        let elapsed = Spent::wall_clock(self.elapsed_ms());
        let run = self.spent.plus(more).plus(&elapsed);
        let exceeded = |scope, budget: &Budget, spent: &Spent| {
            budget
                .exceeded_by(spent)
                .map(|limit| BudgetExceeded::of(scope, limit))
        };
        exceeded(BudgetScope::Run, &self.budgets.run, &run)
            .or_else(|| {
                let agent = self.spending.agent_before.plus(&run);
                exceeded(BudgetScope::Agent, &self.budgets.agent, &agent)
            })
            .or_else(|| {
                let tally = self.spending.tenant.as_ref()?;
                let tenant = tally.spent().plus(more).plus(&elapsed);
                exceeded(BudgetScope::Tenant, &tally.budget(), &tenant)
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_bound_reached_is_named_with_its_maximum_and_the_spending() {
        let budget = Budget {
            total_tokens: Some(100),
            cost_usd: Some(0.5),
            ..Budget::default()
        };
        let mut spent = Spent::model_call(&Usage {
            input: 60,
            output: 30,
            ..Usage::default()
        });
        assert_eq!(budget.exceeded_by(&spent), None);
        spent += &Spent::tool_calls(1);
        spent.output_tokens += 10;
        let tools = Budget {
            tool_calls: Some(1),
            ..Budget::default()
        };
        assert_eq!(tools.exceeded_by(&spent), None);
        assert_eq!(
            tools.exceeded_by(&spent.plus(&Spent::tool_calls(1))),
            Some((BudgetLimit::ToolCalls, Amount::Count(1), Amount::Count(2)))
        );
        assert_eq!(
            budget.exceeded_by(&spent),
            Some((
                BudgetLimit::TotalTokens,
                Amount::Count(100),
                Amount::Count(100)
            ))
        );
        let dollars = Spent {
            cost_usd: 0.75,
            ..Spent::default()
        };
        assert_eq!(
            budget.exceeded_by(&dollars),
            Some((
                BudgetLimit::CostUsd,
                Amount::Dollars(0.5),
                Amount::Dollars(0.75)
            ))
        );
        let exceeded = BudgetExceeded {
            scope: BudgetScope::Tenant,
            limit: BudgetLimit::CostUsd,
            max: Amount::Dollars(0.5),
            spent: Amount::Dollars(0.75),
        };
        assert_eq!(
            serde_json::to_value(exceeded).ok(),
            Some(
                serde_json::json!({"scope": "tenant", "limit": "cost_usd", "max": 0.5, "spent": 0.75})
            )
        );
    }

    #[test]
    fn budgets_read_from_settings_reject_unknown_bounds() {
        let budgets: Budgets =
            serde_json::from_value(serde_json::json!({"run": {"tool_calls": 3}}))
                .unwrap_or_default();
        assert_eq!(budgets.run.tool_calls, Some(3));
        let wrong = serde_json::from_value::<Budgets>(serde_json::json!({"run": {"tokens": 3}}));
        assert!(wrong.is_err());
        let negative = serde_json::from_value::<Budget>(serde_json::json!({"cost_usd": -1.0}));
        assert!(negative.is_err_and(|error| error.to_string().contains("at least 0")));
    }
}
