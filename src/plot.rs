//! `tessera bench --sweep ... --plot out.svg`: time against the swept parameter for
//! Tessera, the baseline and the roofline, drawn with plotters (SVG).

use std::path::Path;

use plotters::prelude::*;

/// One swept value and its times (ms).
pub struct Point {
    /// The swept parameter's value.
    pub x: f64,
    /// Tessera's median.
    pub ms: f64,
    /// The baseline's median, when one was timed.
    pub baseline_ms: Option<f64>,
    /// The least time the work allows at the measured peak and bandwidth.
    pub roofline_ms: f64,
}

/// Draws `points` into an SVG at `path`: log-log axes, one line per series.
pub fn sweep(
    path: &Path,
    title: &str,
    param: &str,
    baseline: Option<&str>,
    points: &[Point],
) -> Result<(), Box<dyn std::error::Error>> {
    let xs = points.iter().map(|p| p.x);
    let ys = points
        .iter()
        .flat_map(|p| [Some(p.ms), p.baseline_ms, Some(p.roofline_ms)])
        .flatten();
    let (x0, x1) = bounds(xs).ok_or("no points to plot")?;
    let (y0, y1) = bounds(ys).ok_or("no times to plot")?;
    if x0 <= 0.0 || y0 <= 0.0 {
        return Err(format!("`{param}` values and times must be positive for log axes").into());
    }
    let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(
            (x0 / 1.2..x1 * 1.2).log_scale(),
            (y0 / 1.5..y1 * 1.5).log_scale(),
        )?;
    chart
        .configure_mesh()
        .x_desc(param)
        .y_desc("median time (ms)")
        .draw()?;
    let mut series = vec![("tessera".to_string(), BLUE, line(points, |p| Some(p.ms)))];
    if let Some(name) = baseline {
        series.push((name.to_string(), RED, line(points, |p| p.baseline_ms)));
    }
    let roof = line(points, |p| Some(p.roofline_ms));
    series.push(("roofline (peak FMA / copy bandwidth)".into(), BLACK, roof));
    for (label, color, data) in series {
        chart
            .draw_series(LineSeries::new(data.clone(), color.stroke_width(2)))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart.draw_series(
            data.into_iter()
                .map(|xy| Circle::new(xy, 3, color.filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// The `(x, y)` pairs of one series (points without a `y` are left out).
fn line(points: &[Point], y: impl Fn(&Point) -> Option<f64>) -> Vec<(f64, f64)> {
    points.iter().filter_map(|p| Some((p.x, y(p)?))).collect()
}

/// The least and greatest of `values`.
fn bounds(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    values.fold(None, |acc, v| match acc {
        None => Some((v, v)),
        Some((lo, hi)) => Some((lo.min(v), hi.max(v))),
    })
}
