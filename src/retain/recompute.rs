//! Evictable retained values: a pooled tensor its pool may give back when the budget refuses
//! a request, rebuilt from its inputs when a reader next needs it (Dynamic Tensor
//! Rematerialization's model: online, greedy, recompute on access).
//!
//! The pool keeps the policy and each value's state, reached through one handle per value
//! (`EvictionHandle`, in `pool/front/evictable.rs`: pin, claim, fill, abandon, evict, read);
//! this module keeps what a value is recomputed from ([`Recompute`]), the reads, and the
//! recompute itself. A read of an evicted value recomputes its evicted inputs first, deepest
//! first, with an explicit stack (no recursion, whatever the depth of the chain), each under
//! the same budget: a recompute's own allocations may evict other values, never one that a
//! read or a recompute in progress pins.

use std::any::Any;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use super::{RetainedValue, RetentionContainer};
use crate::error::{Error, ErrorPhase, Result};
use crate::pool::eviction::value::NotPinned;
use crate::pool::front::evictable::EvictionHandle;
use crate::pool::BufferPool;
use crate::sync::Arc;
use crate::tensor::bytes::pooled_bytes;
use crate::tensor::{DType, Layout, Tensor, TensorRead};

/// The computation of a recompute: it gets one read per input, in the order of the inputs,
/// and returns the value's tensor (same dtype and shape, from the value's pool).
type Compute = dyn Fn(&[TensorRead<'_>]) -> Result<Tensor> + Send + Sync;

/// How an evictable value is recomputed: its inputs (retained values, evictable or not) and
/// the computation, with what it costs.
///
/// ```
/// use ferropool::{BufferPool, Recompute, RetainedValue, Tensor};
/// let pool = BufferPool::new();
/// let x = RetainedValue::from_tensor(Tensor::from_slice_in(&pool, &[1.0f32, -2.0], &[2])?);
/// let relu = {
///     let pool = pool.clone();
///     Recompute::new([x.clone()], move |inputs| {
///         let x = inputs[0].as_slice::<f32>()?;
///         Ok(Tensor::from_iter_in(&pool, x.iter().map(|v| v.max(0.0)), &[2])?)
///     })
///     .with_cost(2) // two element operations
/// };
/// assert_eq!(relu.inputs().len(), 1);
/// # Ok::<(), ferropool::Error>(())
/// ```
pub struct Recompute {
    inputs: Vec<RetainedValue>,
    compute: Box<Compute>,
    cost: Option<u64>,
}

impl fmt::Debug for Recompute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Recompute")
            .field("inputs", &self.inputs.len())
            .field("cost", &self.cost)
            .finish_non_exhaustive()
    }
}

impl Recompute {
    /// A recompute from `inputs` by `compute`, which is given one read per input, in order.
    /// Its errors (and panics, as [`Error::RuntimeState`]) are the read's.
    ///
    /// `compute` runs on the reading thread while the value is marked as being recomputed
    /// there: a read of the same value from that thread (from inside `compute`) is an
    /// [`Error::RuntimeState`], but a read from another thread waits until the recompute
    /// ends. So `compute` must not wait for another thread that reads this value (or a
    /// value whose recompute waits for this one): that would wait for ever.
    pub fn new(
        inputs: impl IntoIterator<Item = RetainedValue>,
        compute: impl Fn(&[TensorRead<'_>]) -> Result<Tensor> + Send + Sync + 'static,
    ) -> Self {
        Self {
            inputs: crate::collect::collect_as_they_come(inputs),
            compute: Box::new(compute),
            cost: None,
        }
    }

    /// What a recompute costs, in any unit shared by the pool's evictable values (FLOPs,
    /// nanoseconds): eviction prefers values cheap to recompute for their size. Without it,
    /// a value costs its bytes, and eviction goes by staleness alone.
    pub fn with_cost(mut self, cost: u64) -> Self {
        self.cost = Some(cost);
        self
    }

    /// The inputs, in the order the computation reads them.
    pub fn inputs(&self) -> &[RetainedValue] {
        &self.inputs
    }
}

/// What an evictable retained value holds: a pooled tensor that its pool may evict and that
/// a read recomputes (see [`RetainedValue::evictable`]).
///
/// ```
/// use ferropool::{BufferPool, Recompute, RetainedValue, RetentionContainer, Tensor};
/// let pool = BufferPool::new();
/// let tensor = Tensor::from_slice_in(&pool, &[0u8; 4096], &[4096])?;
/// let recompute = {
///     let pool = pool.clone();
///     Recompute::new([], move |_| Ok(Tensor::from_slice_in(&pool, &[0u8; 4096], &[4096])?))
/// };
/// let saved = RetainedValue::evictable(&pool, tensor, recompute)?;
/// let RetentionContainer::Evictable(held) = saved.container() else { panic!() };
/// assert!(held.is_resident());
/// assert_eq!(held.bytes(), 4096);
/// # Ok::<(), ferropool::Error>(())
/// ```
pub struct EvictableTensor {
    /// The value as its pool's eviction sees it, and the pool its blocks come from (kept open
    /// while the value lives, so that a recompute always has somewhere to go).
    pub(super) handle: EvictionHandle,
    dtype: DType,
    /// The layout of every block the value has (compact).
    layout: Layout,
    recompute: Recompute,
}

impl fmt::Debug for EvictableTensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EvictableTensor")
            .field("dtype", &self.dtype)
            .field("shape", &self.layout.shape())
            .field("handle", &self.handle)
            .field("recompute", &self.recompute)
            .finish_non_exhaustive()
    }
}

impl Drop for EvictableTensor {
    /// Takes the chain of values this one owns alone apart link by link, then drops its own
    /// computation. Each of those drops runs user code (a closure's captures, a payload's
    /// drop) and may panic: the walk goes on (every link and closure is dropped once) and
    /// the first panic is resumed at the end, when the thread is not unwinding already.
    fn drop(&mut self) {
        // First: no eviction looks at the value while its chain is taken apart.
        self.handle.unregister();
        let mut first_panic = None;
        // A chain of evictable values owns its inputs through the recomputes: take it apart
        // one link at a time here, or dropping a long chain's last handle would recurse once
        // per link (the inputs of an input this drop owns alone come out before it goes).
        let mut pending = std::mem::take(&mut self.recompute.inputs);
        while let Some(mut input) = pending.pop() {
            if let Some(retained) = Arc::get_mut(&mut input.inner) {
                if let RetentionContainer::Evictable(tensor) = &mut retained.container {
                    pending.append(&mut tensor.recompute.inputs);
                }
            }
            drop_caught(input, &mut first_panic);
        }
        // The computation, here rather than with the fields: a panic in it there, while the
        // panic below unwinds, would abort. (The stand-in is never called.)
        let compute =
            std::mem::replace(&mut self.recompute.compute, Box::new(|_| Err(reentered())));
        drop_caught(compute, &mut first_panic);
        if let Some(payload) = first_panic {
            if !std::thread::panicking() {
                std::panic::resume_unwind(payload);
            }
        }
    }
}

/// Drops `value`, catching a panic of its drop into `first_panic` (kept if it holds one).
fn drop_caught<T>(value: T, first_panic: &mut Option<Box<dyn Any + Send>>) {
    if let Err(payload) = catch_unwind(AssertUnwindSafe(move || drop(value))) {
        first_panic.get_or_insert(payload);
    }
}

/// One value on the stack of a read that recomputes: the inputs it has pinned so far.
struct Frame<'v> {
    value: &'v EvictableTensor,
    /// The next input to look at.
    next: usize,
    pins: Vec<&'v EvictableTensor>,
}

impl<'v> Frame<'v> {
    fn new(value: &'v EvictableTensor) -> Self {
        Self {
            value,
            next: 0,
            pins: Vec::new(),
        }
    }

    fn release(self) {
        self.pins.into_iter().for_each(EvictableTensor::unpin);
    }

    /// The top frame's value is pinned: the frame gives its inputs' pins back, and the
    /// value's pin passes to the frame below, whose input it is. Whether the stack is now
    /// empty (the pin is then the caller's).
    fn finish(stack: &mut Vec<Self>) -> bool {
        let Some(done) = stack.pop() else {
            return true;
        };
        let value = done.value;
        done.release();
        match stack.last_mut() {
            None => true,
            Some(parent) => {
                parent.pins.push(value);
                parent.next += 1;
                false
            }
        }
    }
}

const READ: &str = "RetainedValue::tensor_read";

impl EvictableTensor {
    pub(super) fn new(pool: &BufferPool, tensor: Tensor, recompute: Recompute) -> Result<Self> {
        let refused = |message: &str| {
            Error::runtime_state(
                "RetainedValue::evictable",
                ErrorPhase::Construction,
                message,
            )
        };
        let (buffer, dtype, layout) = tensor
            .into_pooled_parts()
            .map_err(|_| refused("a caller-owned payload has no pooled block to evict"))?;
        if buffer.pool_id() != pool.id() {
            return Err(refused("the tensor's block comes from another pool"));
        }
        let parents = recompute
            .inputs
            .iter()
            .filter_map(|input| input.evictable_tensor())
            .map(|input| &input.handle);
        let cost = recompute.cost.unwrap_or(buffer.capacity() as u64);
        let handle = EvictionHandle::register(pool, buffer, cost, parents);
        Ok(Self {
            handle,
            dtype,
            layout,
            recompute,
        })
    }

    /// Whether the value's bytes are in a block now (a snapshot: the pool may evict it, or a
    /// reader recompute it, at any moment).
    pub fn is_resident(&self) -> bool {
        self.handle.is_resident()
    }

    /// The bytes of the value's block (its size class).
    pub fn bytes(&self) -> u64 {
        self.handle.bytes()
    }

    /// The pool the value's blocks come from.
    pub fn pool(&self) -> &BufferPool {
        self.handle.pool()
    }

    /// How the value is recomputed.
    pub fn recompute(&self) -> &Recompute {
        &self.recompute
    }

    /// Gives back one reader's pin (taken by [`pin`](Self::pin)).
    pub(super) fn unpin(&self) {
        self.handle.unpin();
    }

    /// A read of the value's block.
    ///
    /// # Safety
    ///
    /// The caller holds a pin (from [`pin`](Self::pin)) while it uses the read.
    pub(super) unsafe fn read_pinned(&self) -> TensorRead<'_> {
        // SAFETY: the caller's pin.
        let buffer = unsafe { self.handle.pinned_buffer() };
        TensorRead::pooled(pooled_bytes(buffer), self.dtype, &self.layout)
    }

    /// Pins the value resident (one more reader, which the caller gives back with
    /// [`unpin`](Self::unpin)), recomputing it and its evicted inputs first if it was evicted.
    pub(super) fn pin(&self) -> Result<()> {
        match self.handle.pin() {
            Ok(()) => return Ok(()),
            Err(NotPinned::RecomputingHere) => return Err(reentered()),
            Err(NotPinned::Evicted) => {}
        }
        let mut stack = vec![Frame::new(self)];
        let outcome = self.materialize(&mut stack);
        if outcome.is_err() {
            stack.into_iter().for_each(Frame::release);
        }
        outcome
    }

    /// Recomputes the values on `stack` until its first one is pinned: the top's evicted
    /// inputs are pushed and recomputed first; a value whose inputs are all pinned is claimed
    /// and recomputed (or pinned, if another thread made it resident meanwhile). On an error
    /// the frames left on the stack still hold their pins, for the caller to release.
    fn materialize<'v>(&'v self, stack: &mut Vec<Frame<'v>>) -> Result<()> {
        'values: loop {
            let top = stack.len() - 1;
            let value = stack[top].value;
            // Each value is pinned and filled on its own pool's clock (inputs may come from
            // other pools).
            match value.handle.pin() {
                Ok(()) => {
                    // Resident: done with this frame (another thread recomputed it, or it
                    // was never evicted).
                    if Frame::finish(stack) {
                        return Ok(());
                    }
                    continue;
                }
                Err(NotPinned::RecomputingHere) => return Err(reentered()),
                Err(NotPinned::Evicted) => {}
            }
            let inputs = &value.recompute.inputs;
            while stack[top].next < inputs.len() {
                let Some(input) = inputs[stack[top].next].evictable_tensor() else {
                    stack[top].next += 1; // always readable
                    continue;
                };
                match input.handle.pin() {
                    Ok(()) => {
                        stack[top].pins.push(input);
                        stack[top].next += 1;
                    }
                    Err(NotPinned::RecomputingHere) => return Err(reentered()),
                    Err(NotPinned::Evicted) => {
                        stack.push(Frame::new(input));
                        continue 'values;
                    }
                }
            }
            if !value.handle.claim() {
                continue; // another thread recomputes it, or did: pin it (or wait) above
            }
            match value.run() {
                Ok(buffer) => {
                    // Resident and pinned once, for this frame's parent (or the caller).
                    value.handle.fill(buffer);
                    if Frame::finish(stack) {
                        return Ok(());
                    }
                }
                Err(error) => {
                    value.handle.abandon();
                    return Err(error);
                }
            }
        }
    }

    /// Runs the computation over the inputs, which the caller pinned (the evictable ones),
    /// and checks what it returns: a tensor of the value's dtype and shape in a block of the
    /// value's pool.
    fn run(&self) -> Result<crate::pool::PoolBuffer> {
        let reads = self
            .recompute
            .inputs
            .iter()
            .map(|input| match input.evictable_tensor() {
                // SAFETY: the recompute's frame pinned every evictable input before it
                // claimed the value, and keeps the pins until the computation returned.
                Some(input) => Ok(unsafe { input.read_pinned() }),
                None => input.tensor_read(),
            })
            .collect::<Result<Vec<_>>>()?;
        let span = self.handle.pool().trace_span("recompute");
        let started = Instant::now();
        // The caller's code runs in here, the drop of what it returned included (a refused
        // external payload's `Drop` may panic): a panic must not escape the claimed recompute.
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            self.checked((self.recompute.compute)(&reads)?)
        }));
        let ns = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        drop(span);
        let buffer = match outcome {
            Ok(result) => result?,
            Err(panic) => {
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a non-string payload".into());
                // The payload's own drop is the caller's code too: keep its panic out.
                let _ = catch_unwind(AssertUnwindSafe(move || drop(panic)));
                return Err(Error::runtime_state(
                    READ,
                    ErrorPhase::Execution,
                    format!("the recompute of an evicted value panicked: {message}"),
                ));
            }
        };
        self.handle.count_recompute(buffer.capacity() as u64, ns);
        Ok(buffer)
    }

    /// The block of what a recompute returned, if it is a tensor of the value's dtype and
    /// shape in a block of the value's pool.
    fn checked(&self, tensor: Tensor) -> Result<crate::pool::PoolBuffer> {
        let mismatch = |dtype: DType, shape: &[usize]| {
            Error::runtime_state(
                READ,
                ErrorPhase::Execution,
                format!(
                    "the recompute of an evicted {:?} {:?} value returned a {dtype:?} {shape:?} \
                     tensor",
                    self.dtype,
                    self.layout.shape(),
                ),
            )
        };
        let (buffer, dtype, layout) = tensor
            .into_pooled_parts()
            .map_err(|tensor| mismatch(tensor.dtype(), tensor.shape()))?;
        if dtype != self.dtype || layout.shape() != self.layout.shape() {
            return Err(mismatch(dtype, layout.shape()));
        }
        if buffer.pool_id() != self.handle.pool().id() {
            return Err(Error::runtime_state(
                READ,
                ErrorPhase::Execution,
                "the recompute of an evicted value returned a tensor of another pool",
            ));
        }
        Ok(buffer)
    }
}

fn reentered() -> Error {
    Error::runtime_state(
        READ,
        ErrorPhase::Execution,
        "a recompute read the value it recomputes",
    )
}
