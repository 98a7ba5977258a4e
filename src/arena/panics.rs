//! Panics caught from values' destructors while the arena recycles or drops them.

use std::any::Any;
use std::panic::{self, AssertUnwindSafe};

/// Panics caught from values' destructors: the first one is resumed once the arena is
/// consistent, the later ones are dropped.
#[derive(Default)]
pub(super) struct Panics(Option<Box<dyn Any + Send>>);

impl Panics {
    /// Runs `drop_value`, keeping its panic if it panics.
    #[inline]
    pub(super) fn catch(&mut self, drop_value: impl FnOnce()) {
        if let Err(payload) = panic::catch_unwind(AssertUnwindSafe(drop_value)) {
            self.0.get_or_insert(payload);
        }
    }

    /// Whether a panic was caught.
    pub(super) fn caught(&self) -> bool {
        self.0.is_some()
    }

    /// Resumes the first caught panic, if any.
    pub(super) fn resume(&mut self) {
        if let Some(payload) = self.0.take() {
            panic::resume_unwind(payload);
        }
    }

    /// As [`resume`](Self::resume), unless this thread is already unwinding (a second
    /// panic would abort the process); then the payload is dropped.
    pub(super) fn resume_unless_unwinding(&mut self) {
        if !std::thread::panicking() {
            self.resume();
        }
    }
}
