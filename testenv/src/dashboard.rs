//! A Grafana dashboard's panels run against a real Prometheus: every target's query as a graph panel
//! runs it (a range query, dashboard variables set to match everything), and the panels drawn from
//! the data in the dashboard's grid as SVG (turned into PNG with `rsvg-convert`). Only what a reader
//! needs to see: titles, lines, the value range and a legend.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::error::{io_error, TestEnvError};
use crate::prometheus::{Prometheus, Series};

/// One panel's data: its title, where the dashboard puts it (Grafana's 24-column grid), and the
/// series of its queries with their legend text.
pub struct PanelData {
    pub title: String,
    pub grid: (u32, u32, u32, u32),
    pub series: Vec<(String, Series)>,
}

/// A dashboard (Grafana's JSON model).
pub struct Dashboard(Value);

impl Dashboard {
    pub fn load(path: &Path) -> Result<Self, TestEnvError> {
        let text = std::fs::read_to_string(path).map_err(io_error("read", path))?;
        serde_json::from_str(&text)
            .map(Self)
            .map_err(|e| io_error("parse", path)(std::io::Error::other(e)))
    }

    pub fn title(&self) -> &str {
        self.0["title"].as_str().unwrap_or_default()
    }

    /// Runs every panel's queries over the last `window` with variables matching everything
    /// (`$__rate_interval` as 1m). A query Prometheus refuses is an error naming the panel and the
    /// query, and so is one without data when `require_data`.
    pub async fn fetch(
        &self,
        prometheus: &Prometheus,
        window: Duration,
        require_data: bool,
    ) -> Result<Vec<PanelData>, String> {
        let mut panels = Vec::new();
        for panel in self.0["panels"].as_array().into_iter().flatten() {
            let title = panel["title"].as_str().unwrap_or_default().to_owned();
            let mut series = Vec::new();
            for target in panel["targets"].as_array().into_iter().flatten() {
                let expr = substitute(target["expr"].as_str().unwrap_or_default());
                let found = prometheus
                    .query_range(&expr, window)
                    .await
                    .map_err(|e| format!("panel {title}: {e}"))?;
                if require_data && found.is_empty() {
                    return Err(format!("panel {title}: no data for {expr}"));
                }
                let format = target["legendFormat"].as_str().unwrap_or_default();
                series.extend(found.into_iter().map(|s| (legend(format, &s), s)));
            }
            let grid = |key: &str| {
                u32::try_from(panel["gridPos"][key].as_u64().unwrap_or_default()).unwrap_or_default()
            };
            panels.push(PanelData {
                title,
                grid: (grid("x"), grid("y"), grid("w"), grid("h")),
                series,
            });
        }
        Ok(panels)
    }

    /// Draws `panels` (from [`Dashboard::fetch`]) to `path`: SVG, or PNG through `rsvg-convert`
    /// (Debian's librsvg2-bin) when the name ends in `.png`.
    pub fn draw(&self, panels: &[PanelData], path: &Path) -> Result<(), TestEnvError> {
        let svg = render(self.title(), panels);
        if path.extension().is_none_or(|e| e != "png") {
            return std::fs::write(path, svg).map_err(io_error("write", path));
        }
        let source = path.with_extension("svg");
        std::fs::write(&source, svg).map_err(io_error("write", &source))?;
        let status = std::process::Command::new("rsvg-convert")
            .arg("-o")
            .arg(path)
            .arg(&source)
            .status()
            .map_err(io_error("run rsvg-convert for", path))?;
        let _ = std::fs::remove_file(&source);
        if status.success() {
            Ok(())
        } else {
            Err(io_error("convert", path)(std::io::Error::other(format!(
                "rsvg-convert: {status}"
            ))))
        }
    }
}

/// The dashboard's variables set to match everything.
fn substitute(expr: &str) -> String {
    let mut expr = expr.replace("$__rate_interval", "1m");
    while let Some(start) = expr.find('$') {
        let end = expr[start + 1..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(expr.len(), |i| start + 1 + i);
        expr.replace_range(start..end, ".*");
    }
    expr
}

const COLUMN: f64 = 40.0;
const ROW: f64 = 30.0;
const COLORS: [&str; 8] = [
    "#7eb26d", "#eab839", "#6ed0e0", "#ef843c", "#e24d42", "#1f78c1", "#ba43a9", "#705da0",
];

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Grafana's `{{label}}` legend format filled from the series' labels.
fn legend(format: &str, series: &Series) -> String {
    let mut text = format.to_owned();
    for (key, value) in &series.labels {
        text = text.replace(
            &format!("{{{{{key}}}}}"),
            value.as_str().unwrap_or_default(),
        );
    }
    text
}

/// The SVG document of `panels`.
fn render(title: &str, panels: &[PanelData]) -> String {
    let bottom = panels
        .iter()
        .map(|p| p.grid.1 + p.grid.3)
        .max()
        .unwrap_or_default();
    let (width, height) = (24.0 * COLUMN, f64::from(bottom) * ROW + 40.0);
    let mut svg = format!(
        "<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' \
         font-family='DejaVu Sans, sans-serif'>\n<rect width='100%' height='100%' fill='#111217'/>\n\
         <text x='12' y='26' fill='#d8d9da' font-size='18'>{}</text>\n",
        escape(title)
    );
    for panel in panels {
        svg.push_str(&render_panel(panel));
    }
    svg.push_str("</svg>\n");
    svg
}

fn render_panel(panel: &PanelData) -> String {
    let (x, y, w, h) = panel.grid;
    let (left, top) = (f64::from(x) * COLUMN + 6.0, f64::from(y) * ROW + 40.0);
    let (width, height) = (f64::from(w) * COLUMN - 12.0, f64::from(h) * ROW - 12.0);
    let mut out = format!(
        "<g><rect x='{left}' y='{top}' width='{width}' height='{height}' fill='#181b1f' stroke='#2c3235'/>\n\
         <text x='{}' y='{}' fill='#d8d9da' font-size='13'>{}</text>\n",
        left + 8.0,
        top + 18.0,
        escape(&panel.title)
    );
    let points = panel.series.iter().flat_map(|(_, s)| s.points.iter());
    let (mut t0, mut t1, mut v0, mut v1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(t, v) in points.filter(|(_, v)| v.is_finite()) {
        (t0, t1, v0, v1) = (t0.min(t), t1.max(t), v0.min(v), v1.max(v));
    }
    if t0 > t1 {
        out.push_str("</g>\n");
        return out;
    }
    let v0 = v0.min(0.0);
    let v1 = if v1 > v0 { v1 } else { v0 + 1.0 };
    let t1 = if t1 > t0 { t1 } else { t0 + 1.0 };
    let legend_rows = panel.series.len().min(4) as f64;
    let plot = (
        left + 48.0,
        top + 28.0,
        width - 60.0,
        height - 44.0 - 14.0 * legend_rows,
    );
    let sx = |t: f64| plot.0 + (t - t0) / (t1 - t0) * plot.2;
    let sy = |v: f64| plot.1 + plot.3 - (v - v0) / (v1 - v0) * plot.3;
    for (value, label) in [(v0, v0), (v1, v1)] {
        out.push_str(&format!(
            "<line x1='{}' y1='{y}' x2='{}' y2='{y}' stroke='#2c3235'/>\
             <text x='{}' y='{}' fill='#9fa7b3' font-size='10' text-anchor='end'>{}</text>\n",
            plot.0,
            plot.0 + plot.2,
            plot.0 - 4.0,
            sy(value) + 3.0,
            short(label),
            y = sy(value),
        ));
    }
    for (i, (name, series)) in panel.series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let path: Vec<String> = series
            .points
            .iter()
            .filter(|(_, v)| v.is_finite())
            .map(|&(t, v)| format!("{:.1},{:.1}", sx(t), sy(v)))
            .collect();
        out.push_str(&format!(
            "<polyline fill='none' stroke='{color}' stroke-width='1.6' points='{}'/>\n",
            path.join(" ")
        ));
        if i < 4 {
            let row = top + height - 10.0 - 14.0 * (legend_rows - 1.0 - i as f64);
            out.push_str(&format!(
                "<rect x='{}' y='{}' width='10' height='3' fill='{color}'/>\
                 <text x='{}' y='{row}' fill='#c7d0d9' font-size='10'>{}</text>\n",
                left + 8.0,
                row - 4.0,
                left + 22.0,
                escape(name)
            ));
        }
    }
    if panel.series.len() > 4 {
        out.push_str(&format!(
            "<text x='{}' y='{}' fill='#9fa7b3' font-size='10' text-anchor='end'>+{} more</text>\n",
            left + width - 8.0,
            top + height - 10.0,
            panel.series.len() - 4
        ));
    }
    out.push_str("</g>\n");
    out
}

fn short(value: f64) -> String {
    if value.abs() >= 100.0 || value == value.trunc() {
        format!("{value:.0}")
    } else {
        format!("{value:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variables_match_everything_and_the_rate_interval_is_a_minute() {
        assert_eq!(
            substitute(r#"rate(x{a=~"$hostedclusterpackage",b="c"}[$__rate_interval])"#),
            r#"rate(x{a=~".*",b="c"}[1m])"#
        );
    }
}
