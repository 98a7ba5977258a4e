//! Sizes, shapes, strides and iterators a hostile (but legitimate) caller may pass: every one
//! is answered with a typed error, never a wrapped size, an out-of-bounds write, a panic or a
//! hang.

mod common;

use common::assert_pool_consistent;
use ferropool::{
    AllocationGroup, BufferPool, Layout, Recompute, RetainedValue, Tensor, TensorError,
};

/// The element count fits in `usize` but its byte count does not: before the fix the byte
/// count wrapped to 4, an 8-byte block was allocated and 4096 elements were written into it.
#[test]
fn from_iter_in_rejects_a_byte_count_that_overflows() {
    let pool = BufferPool::new();
    let shape = [(1usize << 62) + 1];
    let result = Tensor::from_iter_in(&pool, (0..4096).map(|_| 1.0f32), &shape);
    assert!(
        matches!(result, Err(TensorError::InvalidLayout { .. })),
        "{result:?}"
    );
    let result = Tensor::zeros_in(&pool, ferropool::DType::F32, &shape);
    assert!(
        matches!(result, Err(TensorError::InvalidLayout { .. })),
        "{result:?}"
    );
    assert_eq!(pool.stats().allocations, 0, "nothing was allocated");
}

/// More elements than the shape holds is an error reported without draining the iterator:
/// an endless iterator used to hang, and `repeat` panicked with "iterator is infinite".
#[test]
fn from_iter_in_never_drains_an_endless_iterator() {
    let pool = BufferPool::new();
    let endless = std::iter::from_fn(|| Some(1.0f32));
    let result = Tensor::from_iter_in(&pool, endless, &[4]);
    assert!(
        matches!(
            result,
            Err(TensorError::TooManyElements {
                expected_elements: 4,
                ..
            })
        ),
        "{result:?}"
    );
    let result = Tensor::from_iter_in(&pool, std::iter::repeat(1.0f32), &[4]);
    let message = result.unwrap_err().to_string();
    assert!(message.contains("more than 4"), "{message}");
    let stats = pool.stats();
    assert_eq!(
        stats.in_use_bytes, 0,
        "the partly written buffers went back"
    );
    assert_pool_consistent(&stats);
}

/// A zero-element layout skips the extent check, so its strides may be anything; narrowing
/// it used to compute `offset + start * stride` with wrapping arithmetic.
#[test]
fn narrow_of_a_zero_element_layout_checks_its_offset() {
    let layout = Layout::new(&[0, 3], &[0, usize::MAX], 0).unwrap();
    let narrowed = layout.narrow(1, 2, 1);
    assert!(
        matches!(narrowed, Err(TensorError::InvalidLayout { .. })),
        "{narrowed:?}"
    );
    // The same with a large offset.
    let layout = Layout::new(&[3, 0], &[1, 1], usize::MAX - 1).unwrap();
    assert!(layout.narrow(0, 2, 1).is_err());
}

/// Every constructor of layouts and tensors refuses shapes whose element count overflows,
/// and strides whose extent overflows, with a typed error.
#[test]
fn overflowing_shapes_and_strides_are_typed_errors() {
    let huge = [usize::MAX, 3];
    assert!(Layout::contiguous(&huge).is_err());
    assert!(Layout::new(&huge, &[3, 1], 0).is_err());
    assert!(Layout::new(&[2, 2], &[usize::MAX, 1], 0).is_err());
    assert!(Layout::new(&[2], &[1], usize::MAX).is_err());
    let ok = Layout::contiguous(&[4, 4]).unwrap();
    assert!(ok.reshape(&huge).is_err());
    assert!(ok.narrow(0, usize::MAX, 2).is_err());
    assert!(ok.element_offset(&[usize::MAX, 0]).is_err());
    assert!(Tensor::from_slice(&[1.0f32; 3], &huge).is_err());
    assert!(Tensor::from_iter_in(BufferPool::global(), [1u8], &huge).is_err());
}

/// A shape with a 0 has no elements however large its other dimensions, whatever their
/// order: every order is accepted, and a permutation that moves the 0 behind the huge
/// dimensions counts 0 (its product overflowed before the 0 was reached: a typed error for
/// some orders, a panic in `permute` with overflow checks on).
#[test]
fn zero_element_shapes_count_zero_in_every_order() {
    let orders: [[usize; 3]; 3] = [[0, usize::MAX, 2], [usize::MAX, 0, 2], [usize::MAX, 2, 0]];
    for shape in orders {
        let layout = Layout::contiguous(&shape).unwrap();
        assert_eq!(layout.numel(), 0, "{shape:?}");
        for axes in [[0, 1, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0]] {
            assert_eq!(
                layout.permute(&axes).unwrap().numel(),
                0,
                "{shape:?} {axes:?}"
            );
        }
        let tensor = Tensor::from_slice::<f32>(&[], &shape).unwrap();
        assert_eq!(tensor.numel(), 0);
    }
}

/// A caller-owned payload of the given shape.
#[derive(Debug)]
struct Shaped(&'static [usize]);

impl ferropool::ExternalPayload for Shaped {
    fn tag(&self) -> u32 {
        1
    }
    fn shape(&self) -> &[usize] {
        self.0
    }
}

/// A caller-owned payload whose shape's element count overflows is refused when the tensor
/// is built, so `numel` can never wrap.
#[test]
fn external_payload_shapes_are_checked() {
    let result = Tensor::external(Shaped(&[usize::MAX, 3]));
    assert!(
        matches!(result, Err(TensorError::InvalidLayout { .. })),
        "{result:?}"
    );
}

/// A caller-owned payload of no elements whose other dimensions are huge: accepted, and its
/// `numel` is 0 (a plain product overflowed).
#[test]
fn an_external_payload_of_no_elements_counts_zero() {
    let empty = Tensor::external(Shaped(&[usize::MAX, 2, 0])).unwrap();
    assert_eq!(empty.numel(), 0);
}

/// A request above the largest class, and zero-byte requests, are answered without panics.
#[test]
fn pool_sizes_at_the_edges() {
    let pool = BufferPool::new();
    assert!(pool.alloc(usize::MAX).is_err());
    assert!(pool.alloc_zeroed(usize::MAX).is_err());
    let empty = pool.alloc(0).unwrap();
    assert_eq!(empty.len(), 0);
    drop(empty);
    assert_pool_consistent(&pool.stats());
}

/// A size-1 dimension with a huge stride is within the view's extent (it is never stepped
/// along), so walking the view must not step along it either.
#[test]
fn a_unit_dimension_with_a_huge_stride_is_never_stepped() {
    use ferropool::AllocationGroup;
    let pool = BufferPool::new();
    let t = Tensor::from_slice_in(&pool, &[0.0f32, 1.0, 2.0, 3.0], &[4]).unwrap();
    let (mut group, slots) = AllocationGroup::from_tensors([t]).unwrap();
    let layout = Layout::new(&[1, 2], &[usize::MAX, 2], 1).unwrap();
    let view = group.add_view(slots[0], layout).unwrap();
    assert_eq!(
        group.read_view(view).unwrap().to_vec::<f32>().unwrap(),
        [1.0, 3.0]
    );
    let copied = group.into_tensor(view).unwrap();
    assert_eq!(copied.as_slice::<f32>().unwrap(), &[1.0, 3.0]);
}

/// Safe code cannot read bytes it un-wrote: `as_uninit_mut` makes the buffer count as not
/// written until it is vouched for again.
#[test]
fn a_buffer_handed_out_as_uninit_is_no_longer_readable() {
    use std::mem::MaybeUninit;
    let pool = BufferPool::new();
    let mut buffer = pool.alloc(16).unwrap();
    buffer.fill(7);
    assert!(buffer.as_bytes().is_some());
    buffer.as_uninit_mut()[3] = MaybeUninit::uninit();
    assert!(buffer.as_bytes().is_none());
    assert!(buffer.as_bytes_mut().is_none());
    buffer.fill(1);
    assert_eq!(buffer.as_bytes().unwrap()[3], 1);
}

#[test]
fn tag_scopes_dropped_out_of_order_leave_no_stale_tag() {
    use ferropool::{BufferPool, MemoryTag};
    let pool = BufferPool::new();
    let (outer, inner) = (
        MemoryTag::new("out of order: outer"),
        MemoryTag::new("out of order: inner"),
    );
    let outer_scope = outer.enter();
    let inner_scope = inner.enter();
    drop(outer_scope); // the outer scope first
    let while_inner = pool.alloc(64).unwrap();
    drop(inner_scope);
    let after_both = pool.alloc(128).unwrap();
    let by_tag = pool.memory_by_tag();
    assert_eq!(by_tag.get(inner), 64, "{by_tag:?}");
    assert_eq!(by_tag.get(outer), 0, "a stale tag: {by_tag:?}");
    assert_eq!(by_tag.get(None), 128, "{by_tag:?}");
    drop((while_inner, after_both));
    // In order, the scopes still nest.
    let outer_scope = outer.enter();
    let tagged_outer = {
        let _inner = inner.enter();
        let _in_inner = pool.alloc(256).unwrap();
        pool.alloc(512).unwrap() // still inner: the scope is alive
    };
    let back_to_outer = pool.alloc(1024).unwrap();
    drop(outer_scope);
    let by_tag = pool.memory_by_tag();
    assert_eq!(by_tag.get(inner), 512, "{by_tag:?}");
    assert_eq!(by_tag.get(outer), 1024, "{by_tag:?}");
    drop((tagged_outer, back_to_outer));
}

#[test]
fn a_tag_scope_in_a_thread_local_destructor_leaves_no_stale_tag() {
    use ferropool::{BufferPool, MemoryTag};
    use std::sync::mpsc;
    /// Enters a tag scope, leaves it, and allocates, as its thread's thread-locals go.
    struct LateScope(BufferPool, mpsc::Sender<u64>);
    impl Drop for LateScope {
        fn drop(&mut self) {
            let tag = MemoryTag::new("late scope");
            drop(tag.enter());
            let _buffer = self.0.alloc(64).unwrap();
            let _ = self.1.send(self.0.memory_by_tag().get(tag));
        }
    }
    std::thread_local! {
        static LATE: std::cell::RefCell<Option<LateScope>> = const { std::cell::RefCell::new(None) };
    }
    let pool = BufferPool::new();
    let (sender, tagged) = mpsc::channel();
    let worker = pool.clone();
    std::thread::spawn(move || {
        // The pool's per-thread state first, then this destructor, then the scope list: the
        // list goes first at exit, the pool's state last.
        drop(worker.alloc(64).unwrap());
        LATE.with(|late| *late.borrow_mut() = Some(LateScope(worker, sender)));
        drop(MemoryTag::new("early scope").enter());
    })
    .join()
    .unwrap();
    assert_eq!(
        tagged.recv().unwrap(),
        0,
        "an allocation after the scope ended was tagged"
    );
}

/// A broadcast view (zero strides) of one element counts as many elements as its shape:
/// copying it out is a typed error when the bytes overflow `usize` or the memory is refused
/// (the copy reserved the count unchecked: a capacity-overflow panic, or an abort).
#[test]
fn copying_out_a_huge_broadcast_view_is_a_typed_error() {
    let t = Tensor::from_slice(&[1.0f64], &[1]).unwrap();
    let (mut group, slots) = AllocationGroup::from_tensors([t]).unwrap();
    let overflowing = Layout::new(&[1 << 31, 1 << 30], &[0, 0], 0).unwrap();
    let view = group.add_view(slots[0], overflowing).unwrap();
    let copy = group.read_view(view).unwrap().to_vec::<f64>();
    assert!(
        matches!(
            copy,
            Err(TensorError::CopyTooLarge {
                elements,
                element_bytes: 8
            }) if elements == 1 << 61
        ),
        "{copy:?}"
    );
    // 2^46 elements: 512 TiB, which no machine gives (sanitizers and Miri would stop at
    // the request instead of refusing it).
    #[cfg(not(any(miri, ferropool_sanitizer)))]
    {
        let refused = Layout::new(&[1 << 46], &[0], 0).unwrap();
        let view = group.add_view(slots[0], refused).unwrap();
        let copy = group.read_view(view).unwrap().to_vec::<f64>();
        assert!(
            matches!(copy, Err(TensorError::CopyTooLarge { .. })),
            "{copy:?}"
        );
    }
}

/// An iterator that yields `left` items and claims far more in its size hint.
struct Boastful<T> {
    left: usize,
    make: fn() -> T,
}

impl<T> Iterator for Boastful<T> {
    type Item = T;
    fn next(&mut self) -> Option<T> {
        self.left = self.left.checked_sub(1)?;
        Some((self.make)())
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        (usize::MAX / 4, None)
    }
}

/// Constructors that take an iterator trust what it yields, not its size hint (collecting
/// it reserved the hint's lower bound first: a capacity-overflow panic, or an abort).
#[test]
fn constructors_do_not_trust_a_size_hint() {
    let tensors = Boastful {
        left: 5,
        make: || Tensor::from_slice(&[1u8], &[1]).unwrap(),
    };
    let (group, slots) = AllocationGroup::from_tensors(tensors).unwrap();
    assert_eq!((group.len(), slots.len()), (5, 5));
    let inputs = Boastful {
        left: 2,
        make: || RetainedValue::from_tensor(Tensor::from_slice(&[1u8], &[1]).unwrap()),
    };
    let recompute = Recompute::new(inputs, |_| {
        Tensor::from_slice(&[1u8], &[1]).map_err(Into::into)
    });
    assert_eq!(recompute.inputs().len(), 2);
}

/// Statistics with extreme counts (deserialized, or built by hand) print without an
/// overflow: the summary added two counts to decide whether to show its eviction line.
#[test]
fn statistics_with_extreme_counts_print() {
    let mut stats = ferropool::PoolStats::default();
    stats.evictions = u64::MAX;
    stats.recomputations = 1;
    assert!(stats.to_string().contains("evicted"));
}
