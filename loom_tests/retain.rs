//! Loom model of retained values on a shared allocation group: clones, reads and drops race
//! across threads.
//!
//! The group, its descriptor arena (a per-execution `lazy_static` with a private collector; see
//! `descriptors()` in `src/group/mod.rs`) and the pool all run on loom here. The pool's thread
//! caches are off in this model: a cache created on a spawned loom thread is torn down by that
//! thread's thread-local destructors, which loom runs after `join` returns, and loom then reports
//! the executions as non-deterministic. The shared lists carry every free instead, which is the
//! cross-thread path replay uses. The property: every reader sees the bytes it retained (never
//! freed or reused memory), and the last handle to drop, whichever thread it is on, returns the
//! buffer to the pool exactly once.
#![cfg(loom)]

mod common;

use loom::thread;

use ferropool::{AllocationGroup, BufferPool, PoolConfig, RetainedValue, Tensor};

fn model(f: impl Fn() + Send + Sync + 'static) {
    common::model(20_000, f);
}

/// **clone, read and drop on a shared group**: two threads each read through their own
/// retained handle of one group while the creating thread drops the group handle and its own
/// retained handle. Every read sees the retained values; the buffer goes back to the pool
/// exactly once, after the last handle, on whichever thread that is.
///
/// Planted bug caught: `clone_without_count` (a group handle shared without a reference
/// count of its own: the group is torn down while a retained handle still reads it).
#[test]
fn clone_read_drop_on_a_shared_group() {
    model(|| {
        let pool = BufferPool::with_config(PoolConfig {
            thread_cache_bytes: 0,
            ..PoolConfig::default()
        })
        .unwrap();
        let tensor = Tensor::from_slice_in(&pool, &[1.0f32, 2.0, 3.0, 4.0], &[4]).unwrap();
        let (group, slots) = AllocationGroup::from_tensors([tensor]).unwrap();
        let retained = RetainedValue::from_group(&group, slots[0]).unwrap();
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let mine = retained.clone();
                thread::spawn(move || {
                    let read = mine.tensor_read().expect("a retained descriptor resolves");
                    let sum: f32 = read.as_slice::<f32>().unwrap().iter().sum();
                    assert_eq!(sum, 10.0, "a reader saw other bytes");
                })
            })
            .collect();
        drop(group);
        drop(retained);
        for reader in readers {
            reader.join().unwrap();
        }
        let stats = pool.stats();
        assert_eq!(stats.allocations, 1);
        assert_eq!(stats.frees, 1, "the buffer is returned exactly once");
        assert_eq!(stats.in_use_bytes, 0);
    });
}
