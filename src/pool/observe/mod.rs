//! What the pool tells about itself: its counters (`counters`), kept with the trace in its
//! books (`books`), the statistics read from them (`stats`), memory tags (`tag`), the event
//! trace (`trace`) and its Chrome export (`chrome`).

pub(super) mod books;
pub(super) mod chrome;
pub(super) mod counters;
pub(super) mod stats;
pub(super) mod tag;
pub(super) mod trace;
