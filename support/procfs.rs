//! Process counters from `/proc/self`, shared by the main example and the pool benches (each
//! includes this file with `#[path]`; they are separate targets and cannot share a module
//! otherwise). Linux only; elsewhere the counters read 0.
#![allow(dead_code)] // each including target uses a subset

/// Minor page faults of this process so far (field 10 of `/proc/self/stat`, what
/// `getrusage` reports as `ru_minflt`).
pub fn minor_faults() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The command name (field 2) may hold spaces; fields after its closing ')' are plain.
    let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    rest.split_whitespace()
        .nth(7)
        .and_then(|f| f.parse().ok())
        .unwrap_or(0)
}

/// Peak resident memory of this process in bytes (`VmHWM`).
pub fn peak_rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}
