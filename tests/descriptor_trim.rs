//! The process-wide descriptor arena gives its memory back once the groups that filled it are
//! gone. (Its own test binary: other tests' live descriptors would keep pages.)

use ferropool::{AllocationGroup, BufferPool, Tensor};

#[test]
fn descriptor_pages_go_back_after_many_groups_drop() {
    let pool = BufferPool::new();
    let groups: Vec<AllocationGroup> = (0..if cfg!(miri) { 300 } else { 100_000 })
        .map(|i| {
            let t = Tensor::from_slice_in(&pool, &[i as f32], &[1]).unwrap();
            AllocationGroup::from_tensors([t]).unwrap().0
        })
        .collect();
    let grown = AllocationGroup::descriptor_capacity();
    assert!(grown >= groups.len() as u64);
    drop(groups);
    // Removed descriptors wait for an epoch grace period, then for a recycling call.
    let mut released = 0;
    for _ in 0..100 {
        released += AllocationGroup::trim_descriptors();
        if AllocationGroup::descriptor_capacity() < grown / 4 {
            break;
        }
        // Recycling happens when slots are needed: a few groups come and go.
        for _ in 0..64 {
            let t = Tensor::from_slice_in(&pool, &[0.0f32], &[1]).unwrap();
            drop(AllocationGroup::from_tensors([t]).unwrap());
        }
    }
    let left = AllocationGroup::descriptor_capacity();
    assert!(
        left < grown / 4,
        "{grown} descriptor slots grew, {left} left after releasing {released}"
    );
    // The arena still works, and new groups read their own descriptors.
    let t = Tensor::from_slice_in(&pool, &[4.0f32, 2.0], &[2]).unwrap();
    let (group, slots) = AllocationGroup::from_tensors([t]).unwrap();
    assert_eq!(
        group.read_view(slots[0]).unwrap().to_vec::<f32>().unwrap(),
        [4.0, 2.0]
    );
}
