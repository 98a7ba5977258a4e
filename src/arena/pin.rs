//! Pinning on an arena's collector.
//!
//! On crossbeam-epoch's default collector, `epoch::pin()` uses crossbeam's own thread-local
//! handle. A private collector has no such handle, and registering one per pin costs a
//! list insertion and removal on the collector (tens of times a pin on the default
//! collector). So each thread keeps the handles of the few private collectors it used last.

use crate::sync::epoch::{Collector, Guard};

/// Private collectors whose handle a thread keeps. A kept handle keeps its collector (and
/// the garbage queued on it) alive until the thread exits or uses as many other private
/// collectors, so the bound is small.
#[cfg(not(loom))]
const KEPT: usize = 4;

/// Pins the calling thread on `collector`. Inlined, so that a pin on the default collector
/// is crossbeam-epoch's own, with no frame of a function that also holds the private path.
#[inline]
pub(super) fn pin(collector: &Collector, is_default: bool) -> Guard {
    if is_default {
        return crate::sync::epoch::pin();
    }
    pin_private(collector)
}

/// Pins the calling thread on a private `collector`.
#[inline(never)]
fn pin_private(collector: &Collector) -> Guard {
    #[cfg(not(loom))]
    if let Some(guard) = pin_kept(collector) {
        return guard;
    }
    // Under loom, or while thread-locals are being destroyed, or when a destructor run by
    // a collection on this very thread pins again: a handle of its own.
    collector.register().pin()
}

#[cfg(not(loom))]
fn pin_kept(collector: &Collector) -> Option<Guard> {
    use std::cell::RefCell;

    use crate::sync::epoch::LocalHandle;

    /// A kept handle, and its collector. The collector is dropped after the handle: a
    /// handle that drops its collector's last reference itself makes crossbeam-epoch free the
    /// handle's own record while it is still borrowed (undefined behaviour under Tree
    /// Borrows, found by Miri), so the handle must never be that last reference.
    type Kept = (LocalHandle, Collector);

    std::thread_local! {
        /// The handles, least recently used first.
        static HANDLES: RefCell<Vec<Kept>> = const { RefCell::new(Vec::new()) };
    }
    HANDLES
        .try_with(|handles| {
            let mut handles = handles.try_borrow_mut().ok()?;
            if let Some((last, _)) = handles.last().filter(|(_, c)| c == collector) {
                return Some(last.pin());
            }
            let found = handles.iter().position(|(_, c)| c == collector);
            let kept = match found {
                Some(at) => handles.remove(at),
                None => {
                    if handles.len() == KEPT {
                        // Dropping a handle may run deferred functions; they find the
                        // registry borrowed and register handles of their own.
                        handles.remove(0);
                    }
                    (collector.register(), collector.clone())
                }
            };
            let guard = kept.0.pin();
            handles.push(kept);
            Some(guard)
        })
        .ok()
        .flatten()
}
