//! The eviction's one door for the layers above the pool: an [`EvictionHandle`] is a value
//! registered with its pool's evictor, and everything the retain layer does with it (pin,
//! read, claim a recompute, fill or abandon it, evict it, count it) goes through it. Its drop
//! takes the value out of the registry.

use std::fmt;

use crate::pool::engine::buffer::PoolBuffer;
use crate::pool::engine::inner::Handout;
use crate::pool::eviction::value::{Evictable, NotPinned};
use crate::pool::BufferPool;
use crate::sync::Arc;

/// A registered evictable value and its pool (kept open while the value lives, so that a
/// recompute always has somewhere to go).
pub(crate) struct EvictionHandle {
    pool: BufferPool,
    value: Arc<Evictable<Handout>>,
}

impl fmt::Debug for EvictionHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.value, f)
    }
}

impl Drop for EvictionHandle {
    fn drop(&mut self) {
        self.unregister();
    }
}

impl EvictionHandle {
    /// Registers a resident value of `buffer`'s block with `pool` (the block's own pool),
    /// recomputed at `cost` from `parents`: those of the same pool weigh in its score while
    /// they are evicted too.
    pub(crate) fn register<'p>(
        pool: &BufferPool,
        buffer: PoolBuffer,
        cost: u64,
        parents: impl IntoIterator<Item = &'p EvictionHandle>,
    ) -> Self {
        let parents = parents
            .into_iter()
            .filter(|parent| parent.pool.id() == pool.id())
            .map(|parent| Arc::clone(&parent.value))
            .collect();
        let value = pool
            .inner()
            .evictor
            .register(buffer.into_block(), cost, parents);
        Self {
            pool: pool.clone(),
            value,
        }
    }

    /// The pool the value's blocks come from.
    pub(crate) fn pool(&self) -> &BufferPool {
        &self.pool
    }

    /// Whether the bytes are in a block now (a snapshot; never holds up an eviction).
    pub(crate) fn is_resident(&self) -> bool {
        self.value.is_resident()
    }

    /// The bytes of the value's block (its size class).
    pub(crate) fn bytes(&self) -> u64 {
        self.value.bytes()
    }

    /// Pins the value if it is resident, on its pool's clock; else says why not (see
    /// [`Evictable::try_pin`]).
    pub(crate) fn pin(&self) -> Result<(), NotPinned> {
        self.value.try_pin(self.pool.inner().evictor.clock())
    }

    /// Gives a pin back.
    pub(crate) fn unpin(&self) {
        self.value.unpin();
    }

    /// Claims the recompute of an evicted value (see [`Evictable::claim`]).
    pub(crate) fn claim(&self) -> bool {
        self.value.claim()
    }

    /// Ends a claimed recompute with its block: resident, pinned once for the caller.
    pub(crate) fn fill(&self, buffer: PoolBuffer) {
        self.value
            .fill(self.pool.inner().evictor.clock(), buffer.into_block());
    }

    /// Ends a claimed recompute that failed: evicted again.
    pub(crate) fn abandon(&self) {
        self.value.abandon();
    }

    /// Evicts the value now if it is resident and no reader pins it; whether it did.
    pub(crate) fn evict(&self) -> bool {
        let pool = self.pool.inner();
        pool.evictor.evict(pool, &self.value)
    }

    /// Counts a recompute of `bytes` that took `ns` nanoseconds in the pool's statistics.
    pub(crate) fn count_recompute(&self, bytes: u64, ns: u64) {
        self.pool.inner().evictor.count_recompute(bytes, ns);
    }

    /// The block of a pinned value.
    ///
    /// # Safety
    ///
    /// The caller holds a pin on the value (from [`pin`](Self::pin) or
    /// [`fill`](Self::fill)) for as long as it uses the reference.
    pub(crate) unsafe fn pinned_buffer(&self) -> &PoolBuffer {
        // SAFETY: the caller's pin, as `Evictable::pinned_buffer` requires.
        PoolBuffer::of_block(unsafe { self.value.pinned_buffer() })
    }

    /// Takes the value out of its pool's registry, so that no eviction looks at it any more;
    /// its block goes back to the pool when the last reference to it drops. Once is enough:
    /// a second call finds nothing to take.
    pub(crate) fn unregister(&self) {
        self.pool.inner().evictor.unregister(&self.value);
    }
}
