//! New inputs from old: a small deterministic generator and the mutations a decoder
//! of network input should survive.

/// A xorshift64* generator: deterministic for a seed, good enough to pick mutations.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator started from `seed` (zero is moved off zero).
    pub fn new(seed: u64) -> Self {
        Rng(seed.max(1))
    }

    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number below `bound` (0 when `bound` is 0).
    pub fn below(&mut self, bound: usize) -> usize {
        if bound == 0 {
            0
        } else {
            (self.next_u64() % bound as u64) as usize
        }
    }
}

/// Numbers that have broken decoders: past `u32`, `u64` and `f64`, negative, huge
/// exponents, 2^40.
const NUMBERS: [&str; 9] = [
    "1099511627776",
    "18446744073709551616",
    "1e20",
    "1e300",
    "-1",
    "0.5",
    "99999999999999999999999999",
    "4294967296",
    "NaN",
];

/// Pieces that mean something to an event stream or to JSON.
const TOKENS: [&str; 12] = [
    "\n\n",
    "\r\n",
    "data: ",
    "event: ",
    ": keep-alive\n",
    "data: [DONE]\n\n",
    "\"",
    "\\u0000",
    "{",
    "}]",
    "\u{FEFF}",
    "\"index\":",
];

/// `input` changed by one to four mutations, some splicing from `other`.
pub fn mutate(input: &[u8], other: &[u8], rng: &mut Rng) -> Vec<u8> {
    let mut data = input.to_vec();
    for _ in 0..=rng.below(4) {
        let len = data.len();
        let at = rng.below(len + 1);
        match rng.below(8) {
            0 if len > 0 => {
                let i = rng.below(len);
                data[i] ^= 1 << rng.below(8);
            }
            1 => {
                let bytes: Vec<u8> = (0..=rng.below(8)).map(|_| rng.next_u64() as u8).collect();
                data.splice(at..at, bytes);
            }
            2 if len > 0 => {
                let end = (at + 1 + rng.below(64)).min(len);
                data.drain(at.min(end)..end);
            }
            3 if len > 0 => {
                let start = rng.below(len);
                let end = (start + 1 + rng.below(256)).min(len);
                let piece = data[start..end].repeat(1 + rng.below(16));
                data.splice(at..at, piece);
            }
            4 if !other.is_empty() => {
                let start = rng.below(other.len());
                let end = (start + 1 + rng.below(512)).min(other.len());
                data.splice(at..at, other[start..end].iter().copied());
            }
            5 => overwrite_number(&mut data, rng),
            _ => {
                let token = TOKENS[rng.below(TOKENS.len())].as_bytes();
                data.splice(at..at, token.iter().copied());
            }
        }
    }
    data
}

/// Writes one of [`NUMBERS`] over a run of digits (or anywhere, if there is none).
fn overwrite_number(data: &mut Vec<u8>, rng: &mut Rng) {
    let number = NUMBERS[rng.below(NUMBERS.len())].as_bytes();
    let digits: Vec<usize> = (0..data.len())
        .filter(|&i| data[i].is_ascii_digit())
        .collect();
    if digits.is_empty() {
        let at = rng.below(data.len() + 1);
        data.splice(at..at, number.iter().copied());
        return;
    }
    let start = digits[rng.below(digits.len())];
    let end = (start..data.len())
        .find(|&i| !data[i].is_ascii_digit())
        .unwrap_or(data.len());
    data.splice(start..end, number.iter().copied());
}

/// Up to eight cut points splitting `len` bytes into chunks, in order.
pub fn splits(len: usize, rng: &mut Rng) -> Vec<usize> {
    let mut cuts: Vec<usize> = (0..rng.below(9)).map(|_| rng.below(len + 1)).collect();
    cuts.sort_unstable();
    cuts
}
