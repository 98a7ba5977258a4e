//! The main job of ferropool: a multi-layer perceptron trained on the CPU with activation
//! checkpointing, every allocation in the pool.
//!
//! - [`model`]: the MLP, its training step, the checkpointed forward pass and the replayed
//!   backward pass on a rayon pool;
//! - [`kernels`]: GEMM (the `gemm` crate) and the element-wise pieces;
//! - [`backend`]: where a step's tensors live (the pool, or plain `Vec<f32>`);
//! - [`allocator`]: the process's global allocator (ferropool's front end, glibc or mimalloc);
//! - [`measure`], [`report`], [`compare`], [`plot`], [`show`]: what a run measures and shows.

pub mod allocator;
pub mod args;
pub mod backend;
pub mod compare;
pub mod kernels;
pub mod measure;
pub mod model;
pub mod plot;
pub mod report;
pub mod show;
pub mod sweep;
