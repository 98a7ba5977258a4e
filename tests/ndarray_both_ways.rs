//! ndarray both ways (feature `ndarray`): mutable zero-copy arrays of group views and
//! tensors, refused when a view's indices share elements, and tensors copied in from arrays
//! of any layout.
#![cfg(feature = "ndarray")]

use ferropool::{AllocationGroup, BufferPool, DType, Layout, Tensor, TensorError};
use ndarray::{s, Array, ArrayD, Axis, IxDyn};
use proptest::prelude::*;

/// Every multi-index of `shape`, in row-major order.
fn indices(shape: &[usize]) -> Vec<Vec<usize>> {
    let total: usize = shape.iter().product();
    (0..total)
        .map(|mut flat| {
            let mut index = vec![0; shape.len()];
            for k in (0..shape.len()).rev() {
                index[k] = flat % shape[k];
                flat /= shape[k];
            }
            index
        })
        .collect()
}

/// A permuted and then narrowed view of a 2x3x4 tensor (shape [3, 2, 3], strides [1, 12, 4],
/// offset 1) is written through a mutable array: each element lands where `get` on the view,
/// and the buffer's raw elements, say it lives, without a copy.
#[test]
fn a_permuted_view_is_written_through_a_mutable_array() {
    let t = Tensor::zeros(DType::I32, &[2, 3, 4]).unwrap();
    let (mut group, slots) = AllocationGroup::from_tensors([t]).unwrap();
    let permuted = group.permute(slots[0], &[2, 0, 1]).unwrap();
    let narrowed = group.narrow(permuted, 0, 1, 3).unwrap();
    let (shape, strides, offset) = {
        let view = group.read_view(narrowed).unwrap();
        assert!(!view.is_contiguous());
        (
            view.shape().to_vec(),
            view.strides().to_vec(),
            view.offset(),
        )
    };
    assert_eq!(
        (&shape[..], &strides[..], offset),
        (&[3, 2, 3][..], &[1, 12, 4][..], 1)
    );
    let value = |index: &[usize]| (100 * index[0] + 10 * index[1] + index[2]) as i32 + 1;
    {
        let mut write = group.write_view(narrowed).unwrap();
        let mut array = write.to_ndarray_mut::<i32>().unwrap();
        assert_eq!(array.shape(), &shape[..]);
        assert_eq!(array.strides(), &[1, 12, 4]);
        for index in indices(&shape) {
            array[&index[..]] = value(&index);
        }
    }
    let view = group.read_view(narrowed).unwrap();
    let raw = view.raw::<i32>().unwrap();
    for index in indices(&shape) {
        assert_eq!(view.get::<i32>(&index).unwrap(), value(&index), "{index:?}");
        let at = offset
            + index
                .iter()
                .zip(&strides)
                .map(|(i, s)| i * s)
                .sum::<usize>();
        assert_eq!(raw.elements[at], value(&index));
    }
    // Elements outside the view (dimension 2 index 0 of the tensor) stay zero.
    let whole = group.read_view(slots[0]).unwrap();
    for i in 0..2 {
        for j in 0..3 {
            assert_eq!(whole.get::<i32>(&[i, j, 0]).unwrap(), 0);
        }
    }
    // The mutable array points at the buffer itself.
    let first = raw.elements.as_ptr().wrapping_add(offset);
    let mut write = group.write_view(narrowed).unwrap();
    let array = write.to_ndarray_mut::<i32>().unwrap();
    assert!(std::ptr::eq(array.as_ptr(), first));
}

#[test]
fn into_ndarray_mut_outlives_the_write_view_statement() {
    let t = Tensor::from_slice(&[1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
    let (mut group, slots) = AllocationGroup::from_tensors([t]).unwrap();
    let transposed = group.permute(slots[0], &[1, 0]).unwrap();
    let mut array = group
        .write_view(transposed)
        .unwrap()
        .into_ndarray_mut::<f64>()
        .unwrap();
    array.index_axis_mut(Axis(1), 1).mapv_inplace(|x| -x); // row 1 of `slots[0]`
    assert_eq!(
        group.read_view(slots[0]).unwrap().to_vec::<f64>().unwrap(),
        vec![1.0, 2.0, 3.0, -4.0, -5.0, -6.0]
    );
    assert!(matches!(
        group
            .write_view(transposed)
            .unwrap()
            .into_ndarray_mut::<f32>(),
        Err(TensorError::DTypeMismatch { .. })
    ));
}

/// Views whose indices share elements are refused with `AliasedElements` (not a generic
/// error from ndarray), and the buffer is untouched; a zero stride on an axis of length 1
/// takes no step and is accepted.
#[test]
fn a_view_whose_indices_share_elements_is_refused() {
    let t = Tensor::from_slice(&(0..9).collect::<Vec<i32>>(), &[9]).unwrap();
    let (mut group, slots) = AllocationGroup::from_tensors([t]).unwrap();
    let refused = [
        Layout::new(&[4, 3], &[0, 1], 0).unwrap(), // broadcast rows
        Layout::new(&[3, 3], &[2, 1], 0).unwrap(), // [0, 2] and [1, 0] are element 2
        Layout::new(&[2, 2], &[1, 1], 0).unwrap(), // equal strides
        Layout::new(&[3, 2], &[1, 1], 2).unwrap(),
    ];
    for layout in refused {
        let (shape, strides) = (layout.shape().to_vec(), layout.strides().to_vec());
        let slot = group.add_view(slots[0], layout).unwrap();
        let err = group
            .write_view(slot)
            .unwrap()
            .to_ndarray_mut::<i32>()
            .unwrap_err();
        assert_eq!(
            err,
            TensorError::AliasedElements {
                shape: shape.clone(),
                strides: strides.clone()
            }
        );
        assert!(err.to_string().contains("one element per index"), "{err}");
        assert!(matches!(
            group.write_view(slot).unwrap().into_ndarray_mut::<i32>(),
            Err(TensorError::AliasedElements { .. })
        ));
        // The read side takes the same view without complaint.
        let read = group.read_view(slot).unwrap().to_ndarray::<i32>().unwrap();
        assert_eq!(read.shape(), &shape[..]);
    }
    assert_eq!(
        group.read_view(slots[0]).unwrap().to_vec::<i32>().unwrap(),
        (0..9).collect::<Vec<_>>()
    );
    let accepted = [
        Layout::new(&[1, 3], &[0, 1], 0).unwrap(), // the zero stride takes no step
        Layout::new(&[2, 2], &[3, 2], 0).unwrap(), // interleaved, distinct: 0, 2, 3, 5
        Layout::new(&[3, 0], &[0, 0], 0).unwrap(), // no element at all
        Layout::new(&[2, 2], &[1, 4], 1).unwrap(), // column-major
    ];
    for layout in accepted {
        // Fresh elements for each layout: the fill must reach the view's and no other.
        let original: Vec<i32> = (0..9).collect();
        let whole = group.write_view(slots[0]).unwrap();
        whole
            .into_ndarray_mut::<i32>()
            .unwrap()
            .assign(&ndarray::aview1(&original).into_dyn());
        let slot = group.add_view(slots[0], layout.clone()).unwrap();
        let mut write = group.write_view(slot).unwrap();
        let mut array = write.to_ndarray_mut::<i32>().unwrap();
        assert_eq!(array.shape(), layout.shape());
        array.fill(-1);
        let mut expected = original;
        for index in indices(layout.shape()) {
            expected[layout.element_offset(&index).unwrap()] = -1;
        }
        assert_eq!(
            group.read_view(slots[0]).unwrap().to_vec::<i32>().unwrap(),
            expected,
            "{layout:?}: the view's elements and no others"
        );
    }
}

/// A tensor's refusals of `T`, both ways: the mutable array's, then the shared one's.
fn refusals<T: ferropool::Element + std::fmt::Debug>(t: &mut Tensor) -> [TensorError; 2] {
    [
        t.to_ndarray_mut::<T>().unwrap_err(),
        t.to_ndarray::<T>().unwrap_err(),
    ]
}

#[test]
fn a_tensor_is_an_array_both_ways_without_a_copy() {
    let mut t = Tensor::from_slice(&[1u8, 2, 3, 4, 5, 6], &[3, 2]).unwrap();
    let base = t.as_slice::<u8>().unwrap().as_ptr();
    {
        let array = t.to_ndarray::<u8>().unwrap();
        assert_eq!(array.shape(), &[3, 2]);
        assert_eq!(array[[2, 0]], 5);
        assert!(std::ptr::eq(array.as_ptr(), base));
    }
    {
        let mut array = t.to_ndarray_mut::<u8>().unwrap();
        assert!(std::ptr::eq(array.as_ptr(), base));
        array.index_axis_mut(Axis(1), 1).fill(0);
        array.view_mut().reversed_axes()[[0, 2]] = 50; // row 2, column 0, through a transposed view
    }
    assert_eq!(t.as_slice::<u8>().unwrap(), &[1, 0, 3, 0, 50, 0]);
    let mismatch = TensorError::DTypeMismatch {
        expected: DType::I8,
        found: DType::U8,
    };
    assert_eq!(refusals::<i8>(&mut t), [mismatch.clone(), mismatch]);

    #[derive(Debug)]
    struct Opaque(Vec<usize>);
    impl ferropool::ExternalPayload for Opaque {
        fn tag(&self) -> u32 {
            7
        }
        fn shape(&self) -> &[usize] {
            &self.0
        }
    }
    let mut external = Tensor::external(Opaque(vec![2])).unwrap();
    let external_dtype = |operation| TensorError::ExternalDType {
        operation,
        dtype: DType::External(7),
    };
    assert_eq!(
        refusals::<u8>(&mut external),
        [
            external_dtype("Tensor::to_ndarray_mut"),
            external_dtype("typed read")
        ]
    );

    let mut scalar = Tensor::from_slice(&[1.5f32], &[]).unwrap();
    scalar.to_ndarray_mut::<f32>().unwrap()[IxDyn(&[])] = 2.5;
    assert_eq!(scalar.as_slice::<f32>().unwrap(), &[2.5]);
    let mut empty = Tensor::zeros(DType::F32, &[2, 0, 3]).unwrap();
    assert_eq!(empty.to_ndarray_mut::<f32>().unwrap().shape(), &[2, 0, 3]);
}

/// Arrays of any layout come in as compact tensors in logical (row-major) order: standard,
/// permuted, stepped, broadcast, zero-dimensional, empty.
#[test]
fn from_ndarray_in_copies_any_layout_in_logical_order() {
    let pool = BufferPool::new();
    let a: ArrayD<f32> = Array::from_iter((0..24).map(|i| i as f32))
        .into_shape_with_order(IxDyn(&[2, 3, 4]))
        .unwrap();
    let check = |array: ndarray::ArrayViewD<'_, f32>| {
        let t = Tensor::from_ndarray_in(&pool, &array).unwrap();
        assert_eq!(t.shape(), array.shape());
        assert_eq!(t.dtype(), DType::F32);
        let logical: Vec<f32> = array.iter().copied().collect();
        assert_eq!(t.as_slice::<f32>().unwrap(), &logical[..]);
        // And back: the tensor as an array equals the original.
        assert_eq!(t.to_ndarray::<f32>().unwrap(), array);
    };
    check(a.view());
    let permuted = a.view().permuted_axes(IxDyn(&[2, 0, 1]));
    assert!(permuted.as_slice().is_none());
    check(permuted.clone());
    let t = Tensor::from_ndarray_in(&pool, &permuted).unwrap();
    assert_eq!(&t.as_slice::<f32>().unwrap()[..4], &[0.0, 4.0, 8.0, 12.0]);
    check(a.slice(s![.., ..;2, 1..]).into_dyn());
    check(a.slice(s![..;-1, .., ..]).into_dyn()); // negative stride
    check(a.index_axis(Axis(2), 3).into_dyn());
    let row = ndarray::arr1(&[1.0f32, 2.0, 3.0]);
    check(row.broadcast((2, 3)).unwrap().into_dyn());
    check(ndarray::arr0(4.0f32).into_dyn().view());
    check(a.slice(s![.., 1..1, ..]).into_dyn());

    // A fixed-dimension array of another element type, owned or viewed.
    let m = ndarray::array![[true, false], [false, true]];
    let t = Tensor::from_ndarray_in(&pool, &m.t()).unwrap();
    assert_eq!(t.as_slice::<bool>().unwrap(), &[true, false, false, true]);
    let t = Tensor::from_ndarray_in(&pool, &m).unwrap();
    assert_eq!(t.dtype(), DType::Bool);
    let held = pool.stats().in_use_bytes;
    drop(t);
    assert!(
        pool.stats().in_use_bytes < held,
        "the copy's bytes were the pool's, and went back to it"
    );
}

#[test]
fn from_ndarray_in_reports_a_pool_refusal() {
    let pool = BufferPool::with_config(ferropool::PoolConfig {
        budget: Some(1 << 16),
        ..ferropool::PoolConfig::default()
    })
    .unwrap();
    let big = Array::<f64, _>::zeros((256, 256));
    assert!(matches!(
        Tensor::from_ndarray_in(&pool, &big),
        Err(TensorError::Pool(_))
    ));
    assert!(matches!(
        Tensor::from_ndarray_in(&pool, &big.t()),
        Err(TensorError::Pool(_))
    ));
}

proptest! {
    /// Soundness of the aliasing proof: whenever `check_unaliased` accepts a layout, its
    /// indices reach pairwise distinct elements; and for every layout ndarray agrees.
    #[test]
    fn check_unaliased_accepts_only_distinct_elements(
        dims in proptest::collection::vec((0usize..4, 0usize..7), 0..4),
    ) {
        let shape: Vec<usize> = dims.iter().map(|d| d.0).collect();
        let strides: Vec<usize> = dims.iter().map(|d| d.1).collect();
        let layout = Layout::new(&shape, &strides, 0).unwrap();
        let mut offsets: Vec<usize> = indices(&shape)
            .iter()
            .map(|index| layout.element_offset(index).unwrap())
            .collect();
        offsets.sort_unstable();
        let distinct = offsets.windows(2).all(|w| w[0] != w[1]);
        let accepted = layout.check_unaliased().is_ok();
        prop_assert!(!accepted || distinct, "{shape:?} {strides:?}");
        // A broadcast (zero stride on a longer axis) is never accepted.
        if shape.iter().zip(&strides).any(|(&d, &s)| d > 1 && s == 0) && !shape.contains(&0) {
            prop_assert!(!accepted);
        }
        // ndarray's own check of a mutable view says the same.
        let mut buffer = vec![0u8; offsets.last().map_or(0, |&last| last + 1)];
        if !shape.contains(&0) {
            use ndarray::ShapeBuilder;
            let nd = ndarray::ArrayViewMut::from_shape(
                IxDyn(&shape).strides(IxDyn(&strides)),
                &mut buffer[..],
            );
            prop_assert_eq!(nd.is_ok(), accepted, "{:?} {:?}", shape, strides);
        }
    }
}

/// A length-1 axis may carry any stride (it is never stepped along), even one above
/// `isize::MAX`, which ndarray reads as negative: the arrays of such a view work both ways
/// (its array was accepted and then panicked in `to_owned`, negating `isize::MIN`).
#[test]
fn a_unit_axis_with_a_stride_past_isize_max_makes_a_working_array() {
    let t = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
    let (mut group, slots) = AllocationGroup::from_tensors([t]).unwrap();
    for stride in [1 << 63, usize::MAX] {
        let layout = Layout::new(&[1, 3], &[stride, 1], 0).unwrap();
        let view = group.add_view(slots[0], layout).unwrap();
        let array = group.read_view(view).unwrap().to_ndarray::<f32>().unwrap();
        // (Before, the unit axis's stride read as negative; in a build without overflow
        // checks the rest of this test passed regardless.)
        assert!(
            array.strides().iter().all(|&s| s >= 0),
            "{:?}",
            array.strides()
        );
        assert_eq!(array.iter().copied().collect::<Vec<_>>(), [1.0, 2.0, 3.0]);
        assert_eq!(array.to_owned().sum(), 6.0);
        let mut write = group.write_view(view).unwrap();
        let mut array = write.to_ndarray_mut::<f32>().unwrap();
        array[[0, 2]] = 4.0;
        assert_eq!(array.to_owned().sum(), 7.0);
        array[[0, 2]] = 3.0;
    }
}
