//! The job's drawings, as SVG: a run's memory timeline from the pool's trace (`--plot`), and
//! `sweep`'s frontier of memory against speed.

use std::path::Path;

use ferropool::{BufferPool, PoolEventKind};

/// Draws bytes in use, cached and reserved over time from the pool's trace.
pub fn plot(pool: &BufferPool, boundaries: &[u64], path: &Path) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let events = pool.trace_events();
    // Each event carries the trace's running totals of bytes in use and reserved.
    let points: Vec<(f64, f64, f64)> = events
        .iter()
        .filter(|e| !matches!(e.kind, PoolEventKind::Trim | PoolEventKind::Mark))
        .map(|e| {
            (
                e.at_ns as f64 / 1e6,
                e.in_use_after as f64 / (1 << 20) as f64,
                e.reserved_after as f64 / (1 << 20) as f64,
            )
        })
        .collect();
    let end_ms = points.last().map_or(1.0, |p| p.0).max(1.0);
    let top = points.iter().map(|p| p.2).fold(1.0, f64::max) * 1.1;
    let root = SVGBackend::new(path, (1200, 500)).into_drawing_area();
    let error = |e: &dyn std::fmt::Display| anyhow::anyhow!("drawing the timeline: {e}");
    root.fill(&WHITE).map_err(|e| error(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "ferropool memory timeline (train-replay)",
            ("sans-serif", 22),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..end_ms, 0.0..top)
        .map_err(|e| error(&e))?;
    chart
        .configure_mesh()
        .light_line_style(WHITE)
        .x_desc("time (ms)")
        .y_desc("MiB")
        .draw()
        .map_err(|e| error(&e))?;
    for (i, &ns) in boundaries.iter().enumerate() {
        let x = ns as f64 / 1e6;
        let style = ShapeStyle::from(&RGBColor(150, 80, 200).mix(0.6)).stroke_width(1);
        let series = chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(x, 0.0), (x, top)],
                style,
            )))
            .map_err(|e| error(&e))?;
        if i == 0 {
            series.label("step boundary").legend(|(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], RGBColor(150, 80, 200))
            });
        }
    }
    // A point is (time, in use, reserved); each series picks its y from it.
    type Pick = fn(&(f64, f64, f64)) -> f64;
    let series: [(&str, RGBColor, u32, Pick); 3] = [
        ("reserved from the system", RED, 2, |p| p.2),
        ("cached (reserved - in use)", GREEN, 1, |p| p.2 - p.1),
        ("in use (live tensors)", BLUE, 1, |p| p.1),
    ];
    for (label, color, width, y) in series {
        chart
            .draw_series(LineSeries::new(
                points.iter().map(|p| (p.0, y(p))),
                color.stroke_width(width),
            ))
            .map_err(|e| error(&e))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| error(&e))?;
    root.present().map_err(|e| error(&e))?;
    Ok(())
}

/// A plotted series of `sweep`'s frontier.
#[derive(Debug)]
pub struct Series {
    /// Its name in the legend.
    pub label: &'static str,
    /// Its colour.
    pub color: plotters::style::RGBColor,
    /// Whether its points are joined by a line.
    pub line: bool,
    /// Its points: MiB, steps/s, and a label to write beside the point.
    pub points: Vec<(f64, f64, Option<String>)>,
}

/// Draws `sweep`'s frontier, steps/s against peak memory, on a logarithmic memory axis (the
/// pool's runs and PyTorch's lie an order of magnitude apart), each point labelled as its
/// series says.
pub fn frontier(series: Vec<Series>, path: &Path) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let error = |e: &dyn std::fmt::Display| anyhow::anyhow!("drawing the frontier: {e}");
    let all = series.iter().flat_map(|s| s.points.iter());
    let left = all.clone().map(|p| p.0).fold(f64::MAX, f64::min).min(1e6) * 0.8;
    let right = all.clone().map(|p| p.0).fold(1.0, f64::max) * 1.25;
    let top = all.map(|p| p.1).fold(0.1, f64::max) * 1.15;
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| error(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "memory against speed (train-replay sweep)",
            ("sans-serif", 22),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((left.max(1.0)..right).log_scale(), 0.0..top)
        .map_err(|e| error(&e))?;
    chart
        .configure_mesh()
        .x_desc("peak resident memory of the process (MiB, log scale)")
        .y_desc("steps/s")
        .draw()
        .map_err(|e| error(&e))?;
    for s in series {
        let color = s.color;
        let xy: Vec<(f64, f64)> = s.points.iter().map(|p| (p.0, p.1)).collect();
        if s.line {
            chart
                .draw_series(LineSeries::new(xy.clone(), color.stroke_width(2)))
                .map_err(|e| error(&e))?;
        }
        chart
            .draw_series(xy.iter().map(|&p| Circle::new(p, 5, color.filled())))
            .map_err(|e| error(&e))?
            .label(s.label)
            .legend(move |(x, y)| Circle::new((x + 10, y), 5, color.filled()));
        let labels = s.points.iter().filter_map(|(x, y, label)| {
            let text = label.clone()?;
            Some(Text::new(
                text,
                (*x, *y),
                ("sans-serif", 13).into_font().color(&color),
            ))
        });
        chart.draw_series(labels).map_err(|e| error(&e))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(|e| error(&e))?;
    root.present().map_err(|e| error(&e))?;
    Ok(())
}
