//! Scratch that kernels share across threads: the attention's blocks of operands and weights,
//! the bias gradients' partial sums. A [`Stash`] keeps the buffers that calls gave back, and
//! a call takes one (or makes one when none is free) and gives it back when it ends, so a
//! stash holds as many buffers as calls ever ran at once, each as large as the largest call
//! it served: once as many calls as ever will have run at once, no call allocates (the
//! attention asks for the same size in both passes, so its buffers are alike). Unlike
//! per-thread scratch, a buffer is
//! not held by every thread that ever ran a kernel: a kernel that runs on fewer tasks than
//! there are threads keeps fewer buffers. Like the products' shared panel, it comes from the
//! process's global allocator, not from the training's pool: what a step asks of the pool
//! does not depend on which thread runs which block, so a budget holds the same tensors at
//! any thread count.

use std::sync::{Mutex, PoisonError};

/// Buffers of `f32` that calls take and give back; see the module's documentation.
#[derive(Debug)]
pub struct Stash(Mutex<Vec<Vec<f32>>>);

impl Stash {
    /// An empty stash.
    pub const fn new() -> Self {
        Self(Mutex::new(Vec::new()))
    }

    /// Runs `f` with a scratch slice of `len` elements (its contents are left from earlier
    /// use: `f` writes before it reads). The buffer goes back to the stash when `f` returns;
    /// if `f` panics it is dropped (the lock is never held while `f` runs, so it is never
    /// poisoned by it). `f` may call `with` again (it gets another buffer).
    ///
    /// # Panics
    ///
    /// If `len` elements cannot be allocated (a capacity overflow), before `f` runs.
    pub fn with<R>(&self, len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
        let taken = self.0.lock().unwrap_or_else(PoisonError::into_inner).pop();
        let mut buffer = taken.unwrap_or_default();
        if buffer.len() < len {
            // Zeros, written once: when a buffer first serves a call that large.
            buffer.resize(len, 0.0);
        }
        let result = f(&mut buffer[..len]);
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(buffer);
        result
    }

    /// Buffers in the stash now and the elements they hold.
    #[cfg(test)]
    fn held(&self) -> (usize, usize) {
        let buffers = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        (buffers.len(), buffers.iter().map(Vec::len).sum())
    }
}

impl Default for Stash {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stash_keeps_as_many_buffers_as_calls_ran_at_once() {
        let stash = Stash::new();
        stash.with(10, |a| {
            a.fill(1.0);
            stash.with(20, |b| assert_eq!(b.len(), 20));
        });
        assert_eq!(stash.held(), (2, 30));
        // One call after another: one buffer serves both, grown to the larger.
        stash.with(25, |_| {});
        stash.with(5, |_| {});
        let (buffers, _) = stash.held();
        assert_eq!(buffers, 2);
        // A panicking call drops its buffer and leaves the stash usable.
        let caught = std::panic::catch_unwind(|| stash.with(8, |_| panic!("a kernel's bug")));
        assert!(caught.is_err());
        assert_eq!(stash.held().0, 1);
        assert_eq!(stash.with(3, |a| a.len()), 3);
    }
}
