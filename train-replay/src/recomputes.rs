//! What the backward pass recomputed, by the kind of tensor: the job's recompute closures
//! count each recompute here ([`count`]), and the measurement reads the counts before and
//! after each step ([`now`]).
//!
//! The pool counts its recomputes too (`PoolStats::recomputed_bytes`, `recompute_ns`), but
//! a recompute is the job's closure: only the job knows which of its tensors a value is.
//! The counts are process-wide, as a run is one training per process.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

/// A kind of tensor the forward pass keeps as an evictable value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The GPT's embedding output (tokens' and positions' embeddings summed).
    Embedding,
    /// The GPT's queries, keys and values (layer norm, then a matrix product).
    Qkv,
    /// The attention's output (causal softmax attention over `qkv`).
    Attention,
    /// The residual after the attention (its projection added to the block's input).
    Residual,
    /// The hidden layer of a block's MLP (nanoGPT's `c_fc`), before GELU (layer norm, then
    /// a matrix product).
    Hidden,
    /// A block's output (GELU, a matrix product, the residual added).
    BlockOutput,
    /// A layer's output in the MLP model.
    Layer,
}

impl Kind {
    /// Every kind, in the order of [`now`]'s counts.
    pub const ALL: [Kind; 7] = [
        Kind::Embedding,
        Kind::Qkv,
        Kind::Attention,
        Kind::Residual,
        Kind::Hidden,
        Kind::BlockOutput,
        Kind::Layer,
    ];

    /// The kind's name in the job's output.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Embedding => "embedding",
            Kind::Qkv => "qkv",
            Kind::Attention => "attention",
            Kind::Residual => "residual",
            Kind::Hidden => "fc",
            Kind::BlockOutput => "block output",
            Kind::Layer => "layer",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Recomputes of one kind: how many, their outputs' bytes (the tensors' own sizes: the pool's
/// `recomputed_bytes` counts the blocks they sit in, rounded up to a size class) and the
/// nanoseconds they took.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Recomputes.
    pub count: u64,
    /// Bytes recomputed (the output tensors' sizes).
    pub bytes: u64,
    /// Nanoseconds spent recomputing (the output's allocation and the kernel).
    pub ns: u64,
}

impl std::ops::Sub for Tally {
    type Output = Self;
    fn sub(self, o: Self) -> Self {
        Self {
            count: self.count - o.count,
            bytes: self.bytes - o.bytes,
            ns: self.ns - o.ns,
        }
    }
}

impl std::ops::AddAssign for Tally {
    fn add_assign(&mut self, o: Self) {
        self.count += o.count;
        self.bytes += o.bytes;
        self.ns += o.ns;
    }
}

/// Counts for every kind, indexed as [`Kind::ALL`].
pub type Tallies = [Tally; Kind::ALL.len()];

/// One kind's figures per steady-state step, as `train --json` reports them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KindFigures {
    /// The kind's name ([`Kind::name`]).
    pub kind: String,
    /// Recomputes per step.
    pub per_step: f64,
    /// Bytes recomputed per step.
    pub bytes_per_step: f64,
    /// Seconds spent recomputing per step.
    pub seconds_per_step: f64,
}

/// Each kind's count, bytes and nanoseconds, as three counters.
static COUNTS: [[AtomicU64; 3]; Kind::ALL.len()] =
    [const { [const { AtomicU64::new(0) }; 3] }; Kind::ALL.len()];

/// Counts a recompute of `kind` that wrote `bytes` in `ns` nanoseconds.
pub fn count(kind: Kind, bytes: u64, ns: u64) {
    let [count, b, t] = &COUNTS[kind.index()];
    count.fetch_add(1, Ordering::Relaxed);
    b.fetch_add(bytes, Ordering::Relaxed);
    t.fetch_add(ns, Ordering::Relaxed);
}

/// Every kind's counts so far.
pub fn now() -> Tallies {
    Kind::ALL.map(|kind| {
        let [count, bytes, ns] = &COUNTS[kind.index()];
        Tally {
            count: count.load(Ordering::Relaxed),
            bytes: bytes.load(Ordering::Relaxed),
            ns: ns.load(Ordering::Relaxed),
        }
    })
}

/// The kinds recomputed in `window`, per step of the `measured` steps, in [`Kind::ALL`]'s
/// order.
pub fn figures(window: &Tallies, measured: f64) -> Vec<KindFigures> {
    Kind::ALL
        .iter()
        .zip(window)
        .filter(|(_, tally)| tally.count > 0)
        .map(|(kind, tally)| KindFigures {
            kind: kind.name().to_owned(),
            per_step: tally.count as f64 / measured,
            bytes_per_step: tally.bytes as f64 / measured,
            seconds_per_step: tally.ns as f64 / 1e9 / measured,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_are_per_step_and_name_only_the_kinds_recomputed() {
        let mut window = Tallies::default();
        window[Kind::Residual.index()] = Tally {
            count: 2,
            bytes: 8192,
            ns: 6_000,
        };
        let figures = figures(&window, 2.0);
        assert_eq!(
            figures,
            [KindFigures {
                kind: "residual".to_owned(),
                per_step: 1.0,
                bytes_per_step: 4096.0,
                seconds_per_step: 3e-6,
            }]
        );
    }
}
