//! Bounded stress with leak accounting: 8 threads run a fixed number of mixed operations
//! (pooled buffers freed on other threads, tensors moved into groups, retained values read
//! and dropped across threads, checkpoint chains built and merged) on 2 cores. A counting
//! global allocator then shows that, once everything is dropped and the pool is closed, the
//! bytes held from the system are back to where they started, and the pool's counters
//! balanced before it closed.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use common::scaled;
use ferropool::{
    AllocationGroup, BufferPool, CheckpointNode, PoolConfig, RetainedInputMap, RetainedValue,
    Tensor,
};

struct Counting;
static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards to `System`, counting the bytes live.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is passed on unchanged.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::SeqCst);
        }
        ptr
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as above.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::SeqCst);
        }
        ptr
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as isize, Ordering::SeqCst);
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const THREADS: usize = 8;
/// The smallest buffer the stress allocates; sizes run up to twice this. Miri interprets
/// every element the test writes and checks, so it gets smaller buffers.
const MIN_BUFFER: usize = if cfg!(miri) { 128 << 10 } else { 1 << 20 };
/// Smaller than any buffer the stress allocates: a single leaked buffer exceeds it. It
/// covers what legitimately stays: the closed pool's control block (about 40 KiB), the
/// process-wide descriptor arena's pages, and epoch garbage still queued (54-66 KiB in all,
/// measured).
const SLACK: isize = (MIN_BUFFER as isize) * 3 / 4;

fn run(rounds: usize) -> ferropool::PoolStats {
    let pool = BufferPool::with_config(PoolConfig {
        thread_cache_bytes: 8 << 20,
        ..PoolConfig::default()
    })
    .unwrap();
    let (tx, rx) = mpsc::sync_channel::<ferropool::PoolBuffer>(16);
    let rx = Arc::new(Mutex::new(rx));
    let shared: Arc<Mutex<Vec<RetainedValue>>> = Arc::new(Mutex::new(Vec::new()));
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let (pool, tx, rx, shared) = (
                pool.clone(),
                tx.clone(),
                Arc::clone(&rx),
                Arc::clone(&shared),
            );
            scope.spawn(move || {
                let mut rng = (t as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                let mut chain: Option<Arc<CheckpointNode<usize, usize, usize>>> = None;
                for i in 0..rounds {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let size = MIN_BUFFER + (rng % MIN_BUFFER as u64) as usize;
                    match rng % 5 {
                        0 => {
                            let mut buffer = pool.alloc(size).unwrap();
                            buffer.fill(t as u8);
                            let _ = tx.try_send(buffer); // freed by whichever thread takes it
                        }
                        1 => {
                            let values = vec![t as f32; size / 4];
                            let tensor =
                                Tensor::from_slice_in(&pool, &values, &[size / 4]).unwrap();
                            let (mut group, slots) =
                                AllocationGroup::from_tensors([tensor]).unwrap();
                            let half = group.narrow(slots[0], 0, 0, size / 8).unwrap();
                            let retained = RetainedValue::from_group(&group, half).unwrap();
                            shared.lock().unwrap().push(retained);
                        }
                        2 => {
                            let picked = {
                                let mut all = shared.lock().unwrap();
                                if all.is_empty() {
                                    None
                                } else {
                                    let k = rng as usize % all.len();
                                    Some(all.swap_remove(k))
                                }
                            };
                            if let Some(value) = picked {
                                let read = value.tensor_read().unwrap();
                                let s = read.as_slice::<f32>().unwrap();
                                assert!(s.iter().all(|&v| v == s[0]));
                                let mut inputs = RetainedInputMap::new();
                                inputs.insert(i, Arc::new(value.clone()));
                                chain = Some(Arc::new(CheckpointNode {
                                    graph: Arc::new(i),
                                    alias_key: i,
                                    alias_target: t,
                                    old_inputs: Arc::new(inputs),
                                    prev: chain.take(),
                                }));
                            }
                        }
                        3 => {
                            let taken = rx.lock().unwrap().try_recv();
                            if let Ok(buffer) = taken {
                                let bytes = buffer.as_bytes().unwrap();
                                assert_eq!(bytes[0], bytes[bytes.len() - 1]);
                            }
                        }
                        _ => {
                            // Merge our chain onto a fresh one, then let it go.
                            let other = Arc::new(CheckpointNode {
                                graph: Arc::new(0),
                                alias_key: usize::MAX,
                                alias_target: t,
                                old_inputs: Arc::new(RetainedInputMap::new()),
                                prev: None,
                            });
                            let merged = CheckpointNode::merge_chains(chain.take(), Some(other));
                            assert!(merged.is_some_and(|m| m.depth() >= 1));
                        }
                    }
                }
                drop(chain);
            });
        }
    });
    drop(tx);
    drop(rx);
    shared.lock().unwrap().clear();
    // All that is cached (threads' caches and lists, which belong to the pool, not to the
    // threads) goes back with one trim.
    let stats = pool.stats();
    assert_eq!(pool.trim(), stats.cached_bytes, "{stats:#?}");
    assert_eq!(pool.stats().reserved_bytes, 0);
    stats
}

#[test]
fn every_byte_comes_back_after_a_mixed_stress() {
    // Warm up once: thread-locals, the descriptor arena, the epoch collector.
    run(scaled(50));
    let before = LIVE_BYTES.load(Ordering::SeqCst);
    let stats = run(scaled(400));
    assert_eq!(stats.in_use_bytes, 0, "{stats:#?}");
    assert_eq!(stats.requested_bytes, 0);
    assert_eq!(stats.allocations, stats.frees);
    assert!(stats.system_allocations > 0);
    // The pool closed when `run` returned: every block it held went back to the system.
    for _ in 0..64 {
        crossbeam_epoch::pin().flush();
    }
    let after = LIVE_BYTES.load(Ordering::SeqCst);
    assert!(
        after - before <= SLACK,
        "{} bytes more are held than before the stress ({} system allocations)",
        after - before,
        stats.system_allocations
    );
}
