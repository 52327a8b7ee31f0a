//! The report as text: a table of the levels, the models compared, and the first errors.

use xinf_i18n::Catalog;

use super::stats::Level;
use crate::cli::columns;

/// Milliseconds with one decimal, or `-` without samples.
fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.1}"))
}

/// Rows as columns padded to the widest cell (in terminal columns: headers may be Chinese,
/// Japanese or Korean): the first column to the left, numbers to the right.
fn table(rows: &[Vec<String>]) -> String {
    let count = rows.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..count)
        .map(|c| rows.iter().filter_map(|r| r.get(c)).map(|s| columns::width(s)).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (cell, w))| columns::pad(cell, *w, i == 0))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// The report as text: the table, the TTFT ratios of the other models to the first, and the
/// first error messages. `levels` holds `per_model` levels for each model in turn.
pub(super) fn report(levels: &[Level], per_model: usize, cat: &Catalog) -> String {
    let header = [
        "cli-bench-col-model",
        "cli-bench-col-concurrency",
        "cli-bench-col-requests",
        "cli-bench-col-errors",
        "cli-bench-col-ttft-p50",
        "cli-bench-col-ttft-p95",
        "cli-bench-col-tpot-p50",
        "cli-bench-col-throughput",
    ];
    let mut rows = vec![header.iter().map(|k| cat.text(k, &[])).collect::<Vec<_>>()];
    for l in levels {
        rows.push(vec![
            l.model_uid.clone(),
            l.concurrency.to_string(),
            l.requests.to_string(),
            l.errors.to_string(),
            ms(l.ttft_p50),
            ms(l.ttft_p95),
            ms(l.tpot_p50),
            format!("{:.1}", l.output_tokens_per_s),
        ]);
    }
    let mut out = table(&rows);
    // The levels come model by model, each with the same concurrency levels in the same order.
    let mut models = levels.chunks(per_model.max(1));
    if let Some(base) = models.next() {
        for model in models {
            for (l, b) in model.iter().zip(base) {
                let ratio = match (l.ttft_p50, b.ttft_p50) {
                    (Some(v), Some(b)) if b > 0.0 => format!("{:.2}", v / b),
                    _ => "-".into(),
                };
                let c = l.concurrency.to_string();
                let args = [
                    ("uid", l.model_uid.as_str()),
                    ("base", b.model_uid.as_str()),
                    ("concurrency", &c),
                    ("ratio", &ratio),
                ];
                out.push_str(&cat.text("cli-bench-ratio", &args));
                out.push('\n');
            }
        }
    }
    for l in levels {
        for message in &l.error_messages {
            let c = l.concurrency.to_string();
            let args = [("uid", l.model_uid.as_str()), ("concurrency", &c), ("message", message)];
            out.push_str(&cat.text("cli-bench-error", &args));
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::bench::stats::{Sample, summarize};

    #[test]
    fn report_compares_models_by_ttft() {
        let ok = |ttft_ms| Ok(Sample { ttft_ms, tpot_ms: None, output_tokens: 1 });
        // Two models at concurrency 1 and 4, the second given twice: rows by position, not uid.
        let levels = [
            summarize("a", 1, 1, &[ok(10.0)], 1.0),
            summarize("a", 4, 1, &[ok(40.0)], 1.0),
            summarize("b", 1, 1, &[ok(25.0)], 1.0),
            summarize("b", 4, 1, &[Err("gone".into())], 1.0),
            summarize("b", 1, 1, &[ok(5.0)], 1.0),
            summarize("b", 4, 1, &[ok(20.0)], 1.0),
        ];
        let text = report(&levels, 2, &Catalog::new("en"));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1 + 6 + 4 + 1, "{text}");
        assert!(lines[0].starts_with("MODEL") && lines[0].ends_with("OUTPUT TOK/S"), "{text}");
        assert_eq!(
            &lines[7..],
            [
                "TTFT p50 of `b` / `a` at concurrency 1: 2.50",
                "TTFT p50 of `b` / `a` at concurrency 4: -",
                "TTFT p50 of `b` / `a` at concurrency 1: 0.50",
                "TTFT p50 of `b` / `a` at concurrency 4: 0.50",
                "`b` at concurrency 4: gone",
            ]
        );
        assert_eq!(report(&levels[..2], 2, &Catalog::new("en")).lines().count(), 3);

        // Chinese headers take two terminal columns a character; the columns still line up.
        let text = report(&levels, 2, &Catalog::new("zh-CN"));
        let widths: Vec<usize> = text.lines().take(7).map(columns::width).collect();
        assert!(widths.iter().all(|w| *w == widths[0]), "{text}");
    }
}
