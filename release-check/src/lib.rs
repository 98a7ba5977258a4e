//! ferropool's global allocator, checked where users run it.
//!
//! The crate's own tests build in the debug profile, where nothing is inlined: there the
//! optimiser never sees `PoolAllocator`'s `alloc` and `dealloc` right behind the functions
//! rustc generates for a `#[global_allocator]`, which it treats as an allocation function
//! and its free (a fresh object of exactly the requested size, ended by the free). A release
//! build inlines them into the program's own code, so an allocator that breaks one of the
//! rules those attributes state breaks the program there and nowhere else (a header read
//! through the caller's pointer once turned `drop(vec![1u8; 200 << 10])` into an illegal
//! instruction).
//!
//! Each binary of this package installs one global allocator and runs [`patterns!`]: the
//! allocations programs make, below and above the pool's threshold. `tests/release.rs`
//! runs the binaries; `scripts/release_alloc.sh` builds them in release (opt-level 3, then
//! fat LTO with one codegen unit) and can put a defect back to show that they fail.

/// Expands to a module `patterns` whose `run(name, pooled)` makes the allocations programs
/// make and checks what they read back, then, where the process-wide pool serves the large
/// requests (`pooled`), the pool's figures: every block it served given back, a refused
/// request served by the fallback, and the pool serving again once its budget allows.
/// Prints `release-check NAME: ok` at the end; a failed check panics.
///
/// A macro, not a function of this library: the patterns must be compiled in the crate
/// that declares the `#[global_allocator]`, where rustc defines the allocation functions,
/// so that the optimiser can inline the allocator into them without link-time
/// optimisation. Code of this library would reach them only through a call it cannot see
/// into.
///
/// Some patterns are unused on purpose (`drop(vec![1u8; 200 << 10])`): the optimiser may
/// remove such an allocation, or keep it; either way the program must run. A count of the
/// pool's is asserted only for allocations kept with [`std::hint::black_box`]: an
/// allocation the program cannot observe need not happen (`GlobalAlloc`'s contract).
#[macro_export]
macro_rules! patterns {
    () => {
        /// The allocation patterns (see `ferropool_release_check::patterns!`).
        mod patterns {
            use std::collections::HashMap;
            use std::fmt::Write as _;
            use std::hint::black_box;
            use std::sync::{mpsc, Arc, Mutex};

            use ferropool::PoolAllocator;

            /// Sizes below and above both thresholds the binaries use (4 KiB and 64 KiB),
            /// and on both sides of the page layer's 32 KiB.
            const SIZES: [usize; 8] =
                [100, 3000, 5000, 40_000, 70_000, 200 << 10, 1 << 20, 3 << 20];

            /// Runs every pattern; `pooled`: whether the process-wide pool serves the
            /// large requests.
            pub fn run(name: &str, pooled: bool) {
                let pool = PoolAllocator::pool();
                let start = pool.stats();
                unused();
                read_back();
                boxes_strings_maps();
                capacity_then_shrink();
                growth();
                across_threads();
                if pooled {
                    budget_zero_then_restored();
                    let end = pool.stats();
                    assert_eq!(
                        end.in_use_bytes, start.in_use_bytes,
                        "every block the pool served came back: {end}"
                    );
                    assert_eq!(
                        end.frees - start.frees,
                        end.allocations - start.allocations,
                        "{end}"
                    );
                    assert!(
                        end.allocations > start.allocations,
                        "the pool served: {end}"
                    );
                } else {
                    assert_eq!(
                        pool.stats().allocations,
                        start.allocations,
                        "no pool behind this allocator"
                    );
                }
                println!("release-check {name}: ok");
            }

            /// Allocations the program never reads: the optimiser may drop them or not.
            fn unused() {
                drop(vec![1u8; 100]);
                drop(vec![0u8; 100]);
                drop(vec![1u8; 5000]);
                drop(vec![0u8; 5000]);
                drop(vec![1u8; 200 << 10]);
                drop(vec![0u8; 200 << 10]);
                drop(vec![1u8; 3 << 20]);
                drop(vec![0u8; 3 << 20]);
                drop(Box::<[u64; 1 << 15]>::new_zeroed());
                drop(String::with_capacity(300_000));
                drop(Vec::<f32>::with_capacity(1 << 20));
            }

            /// Filled and zeroed blocks read back, and a zeroed block that reuses a written
            /// one.
            fn read_back() {
                for size in SIZES {
                    let filled = vec![7u8; size];
                    assert!(filled.iter().all(|&b| b == 7), "{size} filled");
                    let mut zeroed = vec![0u8; size];
                    assert!(zeroed.iter().all(|&b| b == 0), "{size} zeroed");
                    zeroed.fill(0xAA);
                    drop(black_box(zeroed));
                    let again = vec![0u8; size];
                    assert!(again.iter().all(|&b| b == 0), "{size} zeroed after a write");
                    drop(filled);
                }
            }

            fn boxes_strings_maps() {
                let boxed: Box<[u64]> = (0..40_000u64).collect();
                assert_eq!(boxed.iter().sum::<u64>(), 40_000 * 39_999 / 2);
                // SAFETY: all-zero bytes are a valid `[u64; N]`.
                let zeros = unsafe { Box::<[u64; 1 << 15]>::new_zeroed().assume_init() };
                assert!(zeros.iter().all(|&x| x == 0));

                let repeated = "ferropool ".repeat(30_000);
                assert_eq!(repeated.len(), 300_000);
                assert!(repeated.ends_with("pool "));
                let mut grown = String::new();
                for i in 0..50_000 {
                    write!(grown, "{i},").unwrap();
                }
                assert!(grown.ends_with(",49998,49999,"));
                assert_eq!(grown.split(',').filter(|s| !s.is_empty()).count(), 50_000);

                let mut map = HashMap::new();
                for i in 0..100_000u64 {
                    map.insert(i, i * 3);
                }
                assert_eq!(map[&77_777], 233_331);
                map.retain(|key, _| key % 2 == 0);
                map.shrink_to_fit();
                assert_eq!(map.len(), 50_000);
                assert_eq!(map.get(&77_777), None);
                assert_eq!(map[&77_778], 233_334);
            }

            /// `with_capacity` then `shrink_to_fit`: a `realloc` from the pool down to the
            /// fallback, and one within the pool that moves the bytes.
            fn capacity_then_shrink() {
                let mut small = Vec::<u32>::with_capacity(1 << 20);
                small.extend(0..10);
                small.shrink_to_fit();
                assert_eq!(small, (0..10).collect::<Vec<u32>>());
                let mut half = Vec::<u8>::with_capacity(300_000);
                half.extend((0..300_000u32).map(|i| i as u8));
                half.truncate(100_000);
                half.shrink_to_fit();
                assert!(half.iter().enumerate().all(|(i, &b)| b == i as u8));
            }

            /// `realloc` growth from a few bytes to megabytes, across the thresholds, in
            /// place and by moves.
            fn growth() {
                let mut pushed = Vec::new();
                for i in 0..(1u32 << 20) {
                    pushed.push(i);
                }
                assert_eq!(
                    pushed.iter().map(|&x| u64::from(x)).sum::<u64>(),
                    (1 << 19) * ((1 << 20) - 1)
                );
                let mut bytes: Vec<u8> = (0..=255u8).collect();
                for size in SIZES {
                    bytes.reserve_exact(size);
                    assert!(bytes
                        .iter()
                        .take(256)
                        .enumerate()
                        .all(|(i, &b)| b == i as u8));
                    bytes.resize(bytes.len() + size / 2, 9);
                }
            }

            /// Blocks made on two threads and freed on two others.
            fn across_threads() {
                let (sender, receiver) = mpsc::sync_channel::<Vec<u64>>(8);
                let receiver = Arc::new(Mutex::new(receiver));
                let consumers: Vec<_> = (0..2)
                    .map(|_| {
                        let receiver = Arc::clone(&receiver);
                        std::thread::spawn(move || {
                            let mut seen = 0usize;
                            loop {
                                let next = receiver.lock().unwrap().recv();
                                let Ok(block) = next else { return seen };
                                let tag = block[0];
                                assert!(
                                    block.iter().all(|&x| x == tag),
                                    "a block changed on its way"
                                );
                                seen += 1;
                            }
                        })
                    })
                    .collect();
                let producers: Vec<_> = (0..2u64)
                    .map(|t| {
                        let sender = sender.clone();
                        std::thread::spawn(move || {
                            for i in 0..200u64 {
                                let len = SIZES[i as usize % SIZES.len()] / 8 + 1;
                                sender.send(vec![t * 1000 + i; len]).unwrap();
                            }
                        })
                    })
                    .collect();
                drop(sender);
                for producer in producers {
                    producer.join().unwrap();
                }
                let seen: usize = consumers.into_iter().map(|c| c.join().unwrap()).sum();
                assert_eq!(seen, 400);
            }

            /// The budget set to 0 while threads allocate (the fallback serves them), then
            /// to 8 MiB: the pool serves again.
            fn budget_zero_then_restored() {
                let pool = PoolAllocator::pool();
                let fallbacks = PoolAllocator::fallback_allocations();
                pool.set_budget(Some(0));
                let threads: Vec<_> = (0..3u8)
                    .map(|t| {
                        std::thread::spawn(move || {
                            for i in 0..20 {
                                let block = black_box(vec![t; (2 + i % 7) << 20]);
                                assert_eq!(block[block.len() - 1], t);
                            }
                        })
                    })
                    .collect();
                for thread in threads {
                    thread.join().unwrap();
                }
                assert!(
                    PoolAllocator::fallback_allocations() >= fallbacks + 60,
                    "the fallback served what the budget refused"
                );
                pool.set_budget(Some(8 << 20));
                let before = pool.stats().allocations;
                drop(black_box(vec![1u8; 200 << 10]));
                let after = pool.stats();
                assert!(
                    after.allocations > before,
                    "once the budget allows, the pool serves again: {after}"
                );
                pool.set_budget(None);
            }
        }
    };
}
