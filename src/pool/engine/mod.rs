//! The pool's engine: its shared state (`inner`), block records (`blocks`), thread caches
//! (`cache`), allocation and free (`ops`), memory from the system within the budget
//! (`reserve`, with the OS advice of `advise`), what goes back (`drain`), and the close
//! (`lifetime`).

pub(super) mod advise;
pub(super) mod blocks;
pub(super) mod cache;
pub(super) mod drain;
pub(super) mod inner;
pub(super) mod life;
pub(super) mod lifetime;
pub(super) mod lists;
pub(super) mod ops;
pub(super) mod reserve;
