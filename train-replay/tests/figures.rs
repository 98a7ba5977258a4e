//! `--trace` and `--plot` leave the reported figures as they are: the trace ring and its
//! exports stay out of the measured pool, the exports are built after the figures are read,
//! and the ring (resident for the whole run) is taken out of the peak RSS. (With the ring
//! and its export in the pool, the peak in use went from 35 to 87 MiB; with the ring from
//! the system, the peak RSS went from 43 to 91 MiB.)

mod common;

/// The table's figures of one run, by row name: byte counts in bytes (the table picks each
/// one's unit), ratios and percentages as numbers.
fn figures(extra: &[&str]) -> Vec<(String, f64)> {
    // One thread: with two, whether the second GEMM thread's packing buffer (216 KiB, from
    // the pool through the front end) is live at the peak depends on scheduling, and a
    // loaded machine moved the peak in use by that much in 1 run of 12. The ring of this
    // run is about 300 KiB.
    let mut args = vec![
        "--steps", "4", "--batch", "256", "--model", "mlp", "--hidden", "256",
    ];
    args.extend_from_slice(&["--layers", "4", "--threads", "1"]);
    args.extend_from_slice(extra);
    let text = common::succeeded(&common::train_replay(&args), extra);
    let figures: Vec<(String, f64)> = text
        .lines()
        .filter_map(|line| {
            let mut cells = line.split('|').map(str::trim).filter(|c| !c.is_empty());
            let (name, value) = (cells.next()?, cells.next()?);
            let mut words = value.split_whitespace();
            let number = words.next()?;
            let value = match words.next() {
                Some(unit) if unit.ends_with('B') => {
                    parse_size::parse_size(format!("{number} {unit}")).ok()? as f64
                }
                _ => number.trim_end_matches(['x', '%']).parse().ok()?,
            };
            Some((name.to_owned(), value))
        })
        .collect();
    assert!(figures.len() >= 8, "the table, in:\n{text}");
    figures
}

#[test]
fn the_trace_and_the_plot_leave_the_figures_unchanged() {
    let dir = std::env::temp_dir().join(format!("train-replay-figures-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (trace, plot) = (dir.join("trace.json"), dir.join("timeline.svg"));
    let plain = figures(&[]);
    let traced = figures(&[
        "--trace",
        trace.to_str().unwrap(),
        "--plot",
        plot.to_str().unwrap(),
    ]);
    assert!(std::fs::metadata(&trace).unwrap().len() > 0);
    assert!(std::fs::metadata(&plot).unwrap().len() > 0);
    std::fs::remove_dir_all(&dir).unwrap();
    let get = |table: &[(String, f64)], name: &str| {
        table
            .iter()
            .find(|(row, _)| row == name)
            .unwrap_or_else(|| panic!("no {name:?} row"))
            .1
    };
    // The pool's peaks are exact on one thread (14 of 14 runs on a loaded machine): within 1%. The peak RSS moves from run to run with what
    // mimalloc (the small requests under the pool) and the GEMM's per-thread buffers touch,
    // by up to about 2 MiB seen: within 3 MiB (the ring or its export in the pool, the bug
    // this guards against, added about 48 MiB).
    for (name, slack) in [
        ("peak live bytes", 0.0),
        ("peak reserved bytes", 0.0),
        ("reserved / live at the peak", 0.0),
        ("peak RSS", f64::from(3 << 20)),
    ] {
        let (before, after) = (get(&plain, name), get(&traced, name));
        assert!(
            (after - before).abs() <= (before * 0.01).max(slack) + 1e-9,
            "{name}: {before} without --trace/--plot, {after} with them"
        );
    }
}
