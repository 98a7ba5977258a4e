//! The pool's engine: its shared state with allocation and free (`inner`), its parts
//! (`life`, the thread caches of `cache`, the shared `lists`, and `memory`: the budget, the
//! block records of `blocks` and the pages, with the OS advice of `advise`), what goes back
//! (`drain`), and the close (`lifetime`).

pub(super) mod advise;
pub(super) mod blocks;
pub(super) mod cache;
pub(super) mod drain;
pub(super) mod inner;
pub(super) mod life;
pub(super) mod lifetime;
pub(super) mod lists;
pub(super) mod memory;
