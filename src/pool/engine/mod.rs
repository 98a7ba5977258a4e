//! The pool's engine: its shared state (`inner`), its parts (`lifecycle`, the thread caches
//! of `cache`, the shared `lists`, and `memory`: the budget, the block records of `blocks` and
//! the pages, with the OS advice of `advise`), the buffer it hands out (`buffer`), the ways in
//! (`alloc`) and out (`free`), what goes back (`drain`), what it reports (`report`), and the
//! close (`close`).

pub(super) mod advise;
pub(super) mod alloc;
pub(super) mod blocks;
pub(super) mod buffer;
pub(super) mod cache;
pub(super) mod close;
pub(super) mod drain;
pub(super) mod free;
pub(super) mod inner;
pub(super) mod lifecycle;
pub(super) mod lists;
pub(super) mod memory;
pub(super) mod report;
