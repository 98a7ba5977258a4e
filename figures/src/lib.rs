//! Process counters from `getrusage(RUSAGE_SELF)`, shared by ferropool's tests, its pool
//! benches, the main job and `runtime-bench`: minor page faults and peak resident memory (on
//! a platform without `getrusage` both read 0); [`spread`], the median and range of
//! repeated runs; and [`getenv`], for the global allocators that pick themselves from the
//! environment.
//!
//! ```
//! let before = ferropool_figures::minor_faults();
//! let touched = vec![1u8; 64 << 20]; // fresh memory, written
//! assert!(touched.iter().all(|&b| b == 1));
//! # #[cfg(unix)] {
//! assert!(ferropool_figures::minor_faults() > before, "fresh pages fault when written");
//! assert!(ferropool_figures::peak_rss() >= 64 << 20, "they were resident at once");
//! # }
//! ```

/// This process's resource usage so far.
#[cfg(unix)]
fn usage() -> Option<libc::rusage> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::uninit();
    // SAFETY: `getrusage` writes a whole `rusage` through the pointer when it returns 0, and
    // `usage` is read only then.
    unsafe {
        (libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) == 0).then(|| usage.assume_init())
    }
}

/// Minor page faults of this process so far (`ru_minflt`).
pub fn minor_faults() -> u64 {
    #[cfg(unix)]
    return usage().map_or(0, |u| u.ru_minflt as u64);
    #[cfg(not(unix))]
    0
}

/// Peak resident memory of this process in bytes (`ru_maxrss`: KiB on Linux, bytes on
/// macOS). Linux keeps it across `execve`: a child process's figure is at least what its
/// parent held when it spawned the child (a few MiB for `compare`, which trains nothing
/// itself).
pub fn peak_rss() -> u64 {
    #[cfg(unix)]
    return usage().map_or(0, |u| {
        let peak = u.ru_maxrss as u64;
        if cfg!(target_os = "macos") {
            peak
        } else {
            peak * 1024
        }
    });
    #[cfg(not(unix))]
    0
}

/// CPU time of this process so far, user and system, every thread, in seconds
/// (`ru_utime + ru_stime`; 0 on a platform without `getrusage`).
pub fn cpu_seconds() -> f64 {
    #[cfg(unix)]
    return usage().map_or(0.0, |u| {
        let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
        seconds(u.ru_utime) + seconds(u.ru_stime)
    });
    #[cfg(not(unix))]
    0.0
}

/// Resident memory of this process now, bytes (`/proc/self/statm`; 0 where that cannot be
/// read).
///
/// ```
/// assert!(ferropool_figures::rss_bytes() % 4096 == 0);
/// ```
pub fn rss_bytes() -> u64 {
    let Ok(statm) = std::fs::read_to_string("/proc/self/statm") else {
        return 0;
    };
    statm
        .split_whitespace()
        .nth(1)
        .and_then(|pages| pages.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// Limits this process's address space to `bytes` (`setrlimit(RLIMIT_AS)`), so that the
/// OS refuses a mapping past it; whether the limit took. For a test that must see `mmap`
/// refused: it holds for the whole process, so such a test runs alone in its binary.
pub fn limit_address_space(bytes: u64) -> bool {
    #[cfg(unix)]
    {
        let limit = libc::rlimit {
            rlim_cur: bytes as libc::rlim_t,
            rlim_max: libc::RLIM_INFINITY,
        };
        // SAFETY: `setrlimit` reads the struct it is given, nothing else.
        unsafe { libc::setrlimit(libc::RLIMIT_AS, &limit) == 0 }
    }
    #[cfg(not(unix))]
    {
        let _ = bytes;
        false
    }
}

/// This process's address space now, bytes (`VmSize` in `/proc/self/status`; 0 where that
/// cannot be read).
pub fn address_space_bytes() -> u64 {
    proc_kib("/proc/self/status", "VmSize:")
}

/// Bytes of this process's anonymous memory that transparent huge pages back now
/// (`AnonHugePages` in `/proc/self/smaps_rollup`; 0 where that cannot be read).
///
/// ```
/// let huge = ferropool_figures::anon_huge_bytes();
/// assert!(huge % 4096 == 0);
/// ```
pub fn anon_huge_bytes() -> u64 {
    proc_kib("/proc/self/smaps_rollup", "AnonHugePages:")
}

/// The figure of the line of `file` that starts with `key` and ends in `kB`, in bytes (0
/// where the file or the line cannot be read).
fn proc_kib(file: &str, key: &str) -> u64 {
    let Ok(text) = std::fs::read_to_string(file) else {
        return 0;
    };
    text.lines()
        .find_map(|line| line.strip_prefix(key))
        .and_then(|rest| rest.trim().strip_suffix("kB"))
        .and_then(|kib| kib.trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

/// The median and the range (min, max) of `values`; `NaN`s sort last. All three are `NaN`
/// for no values.
///
/// ```
/// assert_eq!(ferropool_figures::spread(vec![3.0, 1.0, 2.0]), (2.0, 1.0, 3.0));
/// assert_eq!(ferropool_figures::spread(vec![4.0, 1.0, 2.0, 3.0]), (2.5, 1.0, 4.0));
/// assert!(ferropool_figures::spread(Vec::new()).0.is_nan());
/// ```
pub fn spread(mut values: Vec<f64>) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n == 0 {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    let median = if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    };
    (median, values[0], values[n - 1])
}

/// The value of the environment variable `name`, read with `getenv`, which allocates
/// nothing: a global allocator may call it before the process's first allocation is
/// served. `None` when it is unset (and on a platform without `getenv`).
///
/// # Safety
///
/// No thread may change the environment while the returned bytes are in use (a global
/// allocator choosing itself on the first allocation, before `main` starts a thread, meets
/// this).
pub unsafe fn getenv(name: &std::ffi::CStr) -> Option<&'static [u8]> {
    #[cfg(unix)]
    {
        // SAFETY: `name` is NUL-terminated; `getenv` returns null or a NUL-terminated value
        // in the environment, which the caller's contract keeps unchanged while it is read.
        let value = unsafe { libc::getenv(name.as_ptr()) };
        // SAFETY: as above (a non-null value is a NUL-terminated string).
        (!value.is_null()).then(|| unsafe { std::ffi::CStr::from_ptr(value) }.to_bytes())
    }
    #[cfg(not(unix))]
    {
        let _ = name;
        None
    }
}
