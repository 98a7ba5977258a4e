//! The main job of ferropool: a GPT (or an MLP) trained on the CPU with activation
//! checkpointing, every tensor in the pool.
//!
//! - [`model`]: the two models behind one trait, their training steps, the checkpointed
//!   forward pass and the replayed backward pass on a rayon pool;
//! - [`kernels`]: matrix products (a blocked GEMM of the job's own), attention, layer norm
//!   and the element-wise pieces;
//! - [`data`]: the GPT's text and batches;
//! - [`backend`]: where a step's tensors live (the pool, or plain `Vec<f32>`);
//! - [`allocator`]: the process's global allocator (ferropool's front end, glibc or mimalloc);
//! - [`train`], [`compare`], [`sweep`]: the subcommands, each in its file;
//! - [`measure`], [`least`], [`outside`], [`plot`], [`show`]: what a run measures and shows, and
//!   the share of a budget set aside outside the training's pool.

pub mod allocator;
pub mod args;
pub mod backend;
pub mod child;
pub mod compare;
pub mod data;
pub mod error;
pub mod kernels;
pub mod least;
pub mod measure;
pub mod model;
pub mod outside;
pub mod plot;
pub mod recomputes;
pub mod show;
pub mod sweep;
pub mod train;
