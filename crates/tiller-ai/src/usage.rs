//! Token usage and its cost.
//!
//! Every token is counted in exactly one class: `input` holds only the prompt tokens
//! that were neither read from nor written to the provider's cache, so summing the
//! classes never counts a cached token twice (OpenAI reports cached tokens inside
//! `prompt_tokens`; Anthropic reports them beside `input_tokens`).

use std::ops::AddAssign;

use serde::{Deserialize, Serialize};

use crate::model::ModelCost;

/// Tokens used by one response (or summed over several) and what they cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens billed at the full input price.
    pub input: u64,
    /// Generated tokens, reasoning included.
    pub output: u64,
    /// Prompt tokens served from the provider's cache.
    pub cache_read: u64,
    /// Prompt tokens written to the provider's cache.
    pub cache_write: u64,
    /// Of `output`, the tokens spent on reasoning (already counted in `output`).
    #[serde(default)]
    pub reasoning: u64,
    /// `input + output + cache_read + cache_write`.
    pub total_tokens: u64,
    /// What the tokens cost, in US dollars.
    pub cost: Cost,
}

/// The cost of a [`Usage`] per token class, in US dollars.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Cost {
    /// Cost of `input` tokens.
    pub input: f64,
    /// Cost of `output` tokens.
    pub output: f64,
    /// Cost of `cache_read` tokens.
    pub cache_read: f64,
    /// Cost of `cache_write` tokens.
    pub cache_write: f64,
    /// The sum of the classes.
    pub total: f64,
}

impl Usage {
    /// The prompt's tokens, cached or not: `input + cache_read + cache_write`.
    pub fn prompt_tokens(&self) -> u64 {
        self.input
            .saturating_add(self.cache_read)
            .saturating_add(self.cache_write)
    }

    /// Recomputes `total_tokens` and the cost from the token counts and `prices`.
    /// Counts come from servers, so sums saturate rather than overflow.
    pub fn price(&mut self, prices: &ModelCost) {
        const PER_MILLION: f64 = 1_000_000.0;
        self.total_tokens = self
            .input
            .saturating_add(self.output)
            .saturating_add(self.cache_read)
            .saturating_add(self.cache_write);
        let input = self.input as f64 * prices.input / PER_MILLION;
        let output = self.output as f64 * prices.output / PER_MILLION;
        let cache_read = self.cache_read as f64 * prices.cache_read / PER_MILLION;
        let cache_write = self.cache_write as f64 * prices.cache_write / PER_MILLION;
        self.cost = Cost {
            input,
            output,
            cache_read,
            cache_write,
            total: input + output + cache_read + cache_write,
        };
    }
}

impl AddAssign for Usage {
    /// Adds counts (saturating: they come from servers) and costs.
    fn add_assign(&mut self, other: Usage) {
        self.input = self.input.saturating_add(other.input);
        self.output = self.output.saturating_add(other.output);
        self.cache_read = self.cache_read.saturating_add(other.cache_read);
        self.cache_write = self.cache_write.saturating_add(other.cache_write);
        self.reasoning = self.reasoning.saturating_add(other.reasoning);
        self.total_tokens = self.total_tokens.saturating_add(other.total_tokens);
        self.cost += other.cost;
    }
}

impl AddAssign for Cost {
    fn add_assign(&mut self, other: Cost) {
        self.input += other.input;
        self.output += other.output;
        self.cache_read += other.cache_read;
        self.cache_write += other.cache_write;
        self.total += other.total;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn price_counts_each_class_once() {
        let mut usage = Usage {
            input: 1_000,
            output: 500,
            cache_read: 2_000,
            cache_write: 100,
            reasoning: 200,
            ..Usage::default()
        };
        usage.price(&ModelCost {
            input: 3.0,
            output: 15.0,
            cache_read: 0.3,
            cache_write: 3.75,
        });
        assert_eq!(usage.total_tokens, 3_600);
        assert!((usage.cost.input - 0.003).abs() < 1e-12);
        assert!((usage.cost.output - 0.0075).abs() < 1e-12);
        assert!((usage.cost.cache_read - 0.0006).abs() < 1e-12);
        assert!((usage.cost.cache_write - 0.000375).abs() < 1e-12);
        assert!((usage.cost.total - 0.011475).abs() < 1e-12);
    }

    #[test]
    fn counts_from_a_server_saturate() {
        let mut usage = Usage {
            input: u64::MAX,
            output: 5,
            ..Usage::default()
        };
        usage.price(&ModelCost::default());
        assert_eq!(usage.total_tokens, u64::MAX);
        usage += usage;
        assert_eq!(usage.input, u64::MAX);
    }
}
