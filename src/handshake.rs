//! The owner/drainer handshake behind per-thread state that other threads must be able to take
//! back: a pool thread cache's bins of cached blocks, an arena thread cache's hand of vacant slots
//! and its removal batch.
//!
//! The *owner* (the thread whose thread index names the state) reads and writes its state
//! with plain (relaxed) atomic accesses, inside an *operation* bracketed by
//! [`Handshake::begin`] and [`Handshake::end`], and only when [`Handshake::may_use`] says no
//! drainer holds it. A *drainer* (any thread: a trim, a flush, budget pressure, a close)
//! takes the state without waiting for the owner to come back: a Dekker handshake between the
//! owner's operation sequence (odd while it is busy) and the drainer's `drain` flag, each side
//! storing its own, fencing, then loading the other's. The owner's fence is
//! [`asymmetric::light`] (free on Linux) and the drainer's [`asymmetric::heavy`] (a
//! `membarrier`), since owners run millions of operations for every drain. Afterwards either
//! the drainer sees the owner busy (and waits for that one operation to end) or the owner sees
//! `drain` (and leaves its state alone while it is set).
//!
//! A drainer: [`Handshake::claim`], then `asymmetric::heavy()` (one fence serves every
//! handshake it claimed), then [`Handshake::wait_out`]; the state is then the drainer's until
//! [`Handshake::hand_back`].
//!
//! The same bracket also keeps memory alive: an arena's `discard` reads a slot by a key that
//! may be stale, with no epoch pin, inside an operation of its own thread cache, and `trim`,
//! after unlinking slot pages (its "flag" is the page pointer it swapped out), issues the
//! heavy fence and [`wait_out`](Handshake::wait_out)s every thread cache before it frees
//! them. So every unpinned read of a slot that may be released happens inside an
//! operation of the reader's own thread cache.
//!
//! Nothing between `begin` and `end` may panic or run user code (arithmetic there wraps,
//! nothing there allocates): a panic would leave the owner busy for good, and a drainer would
//! wait for it forever; user code could start a second, nested operation.

use crate::sync::{asymmetric, yield_now, AtomicU32, AtomicU64, Ordering};

/// One owner's half (its operation sequence) and the drainers' half (the flag) of the
/// handshake.
pub(crate) struct Handshake {
    /// The owner's operation sequence: odd while the owner is inside an operation (`begin`
    /// adds one, `end` another). A drainer that saw it odd knows the operation ended once it
    /// changes; the pool's idle policy reads it as the number of operations so far.
    seq: AtomicU64,
    /// Set (by compare-exchange) by a drainer; the owner leaves its state alone while it is
    /// set.
    drain: AtomicU32,
}

/// An operation of the owner under way: what [`Handshake::begin`] returns and
/// [`Handshake::end`] takes back (neither `Copy` nor `Clone`, so an operation ends once).
///
/// Invariant: holds the odd value `begin` stored in the handshake's sequence, which only its
/// owner writes.
#[must_use = "an operation must be ended with `Handshake::end`"]
#[derive(Debug)]
pub(crate) struct Busy(u64);

impl Handshake {
    pub(crate) fn new() -> Self {
        Self {
            seq: AtomicU64::new(0),
            drain: AtomicU32::new(0),
        }
    }

    /// Starts an operation of the owner. Follow it with [`may_use`](Self::may_use) (and any
    /// other flag the caller pairs with the heavy fence), and end it with
    /// [`end`](Self::end) on every path.
    #[inline(always)]
    pub(crate) fn begin(&self) -> Busy {
        let seq = self.seq.load(Ordering::Relaxed);
        debug_assert!(seq.is_multiple_of(2), "operations of one owner do not nest");
        let busy = seq.wrapping_add(1);
        // `Release`: a drainer that reads this value (odd) and later sees it move on must
        // also see the effects of the operations before it (a later store of this thread
        // does not continue the release sequence of `end`'s store).
        self.seq.store(busy, Ordering::Release);
        asymmetric::light();
        Busy(busy)
    }

    /// Inside an operation: whether the owner may use its state (no drainer holds it).
    #[inline(always)]
    pub(crate) fn may_use(&self) -> bool {
        self.drain.load(Ordering::Acquire) == 0
    }

    /// Ends an operation of the owner: everything it did is visible to a drainer that then
    /// sees the sequence move on.
    ///
    /// It stores the value `busy` carries plus one instead of loading the sequence again:
    /// the owner alone writes it, so nothing moved it since `begin`, and a hot loop of
    /// operations then reads the sequence from memory once per operation, not twice (each
    /// read waits on the store before it).
    #[inline(always)]
    pub(crate) fn end(&self, busy: Busy) {
        self.seq.store(busy.0.wrapping_add(1), Ordering::Release);
    }

    /// Operations the owner started so far.
    pub(crate) fn operations(&self) -> u64 {
        self.seq.load(Ordering::Relaxed).div_ceil(2)
    }

    /// A drainer's first step: sets the flag; false when another drainer holds it (that one
    /// takes the state). Then `asymmetric::heavy()` and [`wait_out`](Self::wait_out).
    pub(crate) fn claim(&self) -> bool {
        self.claim_as(1)
    }

    /// [`claim`](Self::claim) with the drainer's own `token` (non-zero) as the flag, so that
    /// a drainer that claims many handshakes before its one heavy fence can find its own
    /// again with [`claimed_by`](Self::claimed_by) instead of keeping a list.
    pub(crate) fn claim_as(&self, token: u32) -> bool {
        debug_assert!(token != 0, "0 is the flag's free value");
        self.drain
            .compare_exchange(0, token, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }

    /// Whether the drainer with `token` holds the handshake (only that drainer's answer is
    /// stable: it alone releases its claim).
    pub(crate) fn claimed_by(&self, token: u32) -> bool {
        self.drain.load(Ordering::Relaxed) == token
    }

    /// Whether some drainer holds the handshake now (a snapshot). Acquire: once it reads the
    /// flag a drainer cleared, what that drainer did before [`hand_back`](Self::hand_back)
    /// is visible.
    pub(crate) fn is_claimed(&self) -> bool {
        self.drain.load(Ordering::Acquire) != 0
    }

    /// A drainer's last step: hands the state back to its owner. Release: the owner's next
    /// operation sees what the drainer left.
    pub(crate) fn hand_back(&self) {
        self.drain.store(0, Ordering::Release);
    }

    /// After a heavy fence that followed the caller's store of its flag (`drain`, the pool's
    /// `closed`, or the page pointers an arena's `trim` unlinked): waits until the owner is
    /// out of the operation it was in at the fence, if any. Later operations see the flag,
    /// so they need no waiting: the sequence moving on means the one in flight has ended
    /// (and its effects are visible: `end` stores it with `Release`).
    pub(crate) fn wait_out(&self) {
        let in_flight = self.seq.load(Ordering::Acquire);
        if in_flight % 2 == 1 {
            while self.seq.load(Ordering::Acquire) == in_flight {
                yield_now(); // the owner is inside one short operation
            }
        }
    }
}
