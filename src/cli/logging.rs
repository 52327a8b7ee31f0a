//! Log output on stderr: `XINF_LOG` filters it (`tracing` `EnvFilter` syntax, `warn` when
//! unset or invalid), `XINF_LOG_FORMAT=json` writes one JSON object per line for log
//! collectors, anything else readable text. Colours only go to a terminal, so that files and
//! pipes get no escape codes.

use std::io::IsTerminal;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tracing::subscriber::Interest;
use tracing::{Metadata, Subscriber};
use tracing_subscriber::filter::{FilterExt, LevelFilter};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::{Context, Filter, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

impl Format {
    /// The format `XINF_LOG_FORMAT` names; `None` for a value it does not know.
    fn parse(value: &str) -> Option<Self> {
        match value.trim().to_ascii_lowercase().as_str() {
            "" | "text" | "pretty" => Some(Self::Text),
            "json" => Some(Self::Json),
            _ => None,
        }
    }
}

/// Targets that write a line for a connection whatever the client sends: actix for bytes that
/// are not an HTTP request (garbage, HTTP/0.9, an over-long URI; the client has its 400
/// already), ractor_cluster for bytes that are not a cluster frame and for each session that
/// ends. Anyone who can reach a port could fill the log with them, so each writes at most
/// [`PER_MINUTE`] lines a minute.
const PER_CONNECTION: [&str; 2] = ["actix_http::h1::dispatcher", "ractor_cluster"];
const PER_MINUTE: u32 = 10;

/// Counts the lines of the [`PER_CONNECTION`] targets in the current minute, and those not
/// written, which [`report_unwritten`] tells in a line of its own. Clones share their counts.
#[derive(Debug, Default, Clone)]
struct Sampler(Arc<Mutex<Counts>>);

#[derive(Debug, Default)]
struct Counts {
    /// When the minute began (`None` before the first line), and each target's lines in it.
    minute: (Option<Instant>, [u32; PER_CONNECTION.len()]),
    /// Each target's lines not written since the last report.
    unwritten: [u64; PER_CONNECTION.len()],
}

/// The index in [`PER_CONNECTION`] of the target `target` falls under.
fn per_connection(target: &str) -> Option<usize> {
    PER_CONNECTION.iter().position(|t| target.starts_with(t))
}

impl<S> Filter<S> for Sampler {
    fn enabled(&self, meta: &Metadata<'_>, _: &Context<'_, S>) -> bool {
        !meta.is_event() || self.allows(meta.target())
    }

    /// Lets every level through, so that the combined filter's hint stays `XINF_LOG`'s and
    /// events below it are skipped before any filter runs.
    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(LevelFilter::TRACE)
    }

    /// Asked at each event of the sampled targets, never for the others.
    fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> Interest {
        match per_connection(meta.target()) {
            Some(_) if meta.is_event() => Interest::sometimes(),
            _ => Interest::always(),
        }
    }
}

impl Sampler {
    /// Whether an event of `target` is written.
    fn allows(&self, target: &str) -> bool {
        let Some(i) = per_connection(target) else {
            return true;
        };
        let mut counts = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        let minute = &mut counts.minute;
        if minute.0.is_none_or(|began| now.duration_since(began) >= Duration::from_secs(60)) {
            *minute = (Some(now), [0; PER_CONNECTION.len()]);
        }
        minute.1[i] = minute.1[i].saturating_add(1);
        let written = minute.1[i] <= PER_MINUTE;
        if !written {
            counts.unwritten[i] += 1;
        }
        written
    }

    /// Each sampled target with the lines not written since the last call, if any.
    fn take_unwritten(&self) -> Vec<(&'static str, u64)> {
        let mut counts = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let taken = std::mem::take(&mut counts.unwritten);
        PER_CONNECTION.into_iter().zip(taken).filter(|(_, n)| *n > 0).collect()
    }
}

/// Every minute, a line for each sampled target that had lines not written, so that a flood
/// of them shows in the log with its size.
fn report_unwritten(sampler: Sampler) {
    let spawned = std::thread::Builder::new().name("xinf-log-sampler".into()).spawn(move || {
        loop {
            std::thread::sleep(Duration::from_secs(60));
            for (target, n) in sampler.take_unwritten() {
                tracing::warn!(target: "xinf::log", unwritten = n, "{target}: {n} lines not written in the last minute (at most {PER_MINUTE} a minute are)");
            }
        }
    });
    if let Err(e) = spawned {
        tracing::warn!(target: "xinf::log", "cannot count the log lines not written: {e}");
    }
}

/// The filter `XINF_LOG` (`spec`) asks for; `warn` when unset or invalid.
fn filter(spec: Option<&str>) -> EnvFilter {
    spec.and_then(|s| EnvFilter::try_new(s).ok()).unwrap_or_else(|| EnvFilter::new("warn"))
}

/// Installs the process's log subscriber (once; later calls do nothing).
pub(crate) fn init() {
    let filter = filter(std::env::var("XINF_LOG").ok().as_deref());
    let raw = std::env::var("XINF_LOG_FORMAT").unwrap_or_default();
    let format = Format::parse(&raw);
    let ansi = std::io::stderr().is_terminal();
    let sampler = Sampler::default();
    let installed =
        subscriber(format.unwrap_or(Format::Text), ansi, filter, sampler.clone(), std::io::stderr).try_init();
    if installed.is_ok() {
        report_unwritten(sampler);
        if format.is_none() {
            tracing::warn!(value = %raw, "XINF_LOG_FORMAT is neither `text` nor `json`; writing text");
        }
    }
}

/// The subscriber writing `format` lines that pass `filter` to `writer`.
fn subscriber<W>(
    format: Format,
    ansi: bool,
    filter: EnvFilter,
    sampler: Sampler,
    writer: W,
) -> Box<dyn Subscriber + Send + Sync>
where
    W: for<'a> MakeWriter<'a> + Send + Sync + 'static,
{
    let filter = filter.and(sampler);
    let layer = tracing_subscriber::fmt::layer().with_writer(writer).with_ansi(ansi);
    match format {
        Format::Text => Box::new(tracing_subscriber::registry().with(layer.with_filter(filter))),
        // JSON never carries colour codes, whatever `ansi` says.
        Format::Json => {
            Box::new(tracing_subscriber::registry().with(layer.with_ansi(false).json().with_filter(filter)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A writer into a shared buffer.
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().map_err(|_| std::io::Error::other("poisoned"))?.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn text_of(buffer: &Buffer) -> String {
        let bytes = buffer.0.lock().map(|b| b.clone()).unwrap_or_default();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    fn capture(format: Format, ansi: bool) -> String {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let sub =
            subscriber(format, ansi, EnvFilter::new("info"), Sampler::default(), move || writer.clone());
        tracing::subscriber::with_default(sub, || {
            tracing::info!(model_uid = "m", status = 503, "first \"line\"");
            tracing::warn!("second line");
            tracing::debug!("filtered out");
        });
        let bytes = buffer.0.lock().map(|b| b.clone()).unwrap_or_default();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    #[test]
    fn json_lines_parse() {
        let text = capture(Format::Json, true);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        for line in &lines {
            let value: serde_json::Value =
                serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}"));
            assert!(value.get("level").is_some() && value.get("fields").is_some(), "{line}");
        }
        let first: serde_json::Value = serde_json::from_str(lines[0]).unwrap_or_default();
        assert_eq!(first["level"], "INFO");
        assert_eq!(first["fields"]["message"], "first \"line\"");
        assert_eq!(first["fields"]["model_uid"], "m");
        assert!(!text.contains('\u{1b}'));
    }

    #[test]
    fn colour_only_when_asked() {
        assert!(!capture(Format::Text, false).contains('\u{1b}'));
        assert!(capture(Format::Text, true).contains('\u{1b}'));
    }

    /// Lines of the targets that write one per connection are let through ten a minute each;
    /// others are not counted, and the filter is as asked.
    #[test]
    fn per_connection_lines_are_sampled() {
        let shown = |spec: Option<&str>| {
            let buffer = Buffer::default();
            let writer = buffer.clone();
            let sampler = Sampler::default();
            let sub = subscriber(Format::Text, false, filter(spec), sampler.clone(), move || writer.clone());
            tracing::subscriber::with_default(sub, || {
                for _ in 0..25 {
                    tracing::error!(target: "actix_http::h1::dispatcher", "stream error: request parse error");
                    tracing::warn!(target: "ractor_cluster::net::session", "framing error");
                    tracing::warn!(target: "xinf::api", "kept");
                    tracing::info!(target: "xinf::api", "informed");
                }
            });
            // The lines not written are counted, once.
            let unwritten = sampler.take_unwritten();
            if !text_of(&buffer).contains("parse error") {
                return text_of(&buffer);
            }
            assert_eq!(unwritten, [("actix_http::h1::dispatcher", 15), ("ractor_cluster", 15)]);
            assert_eq!(sampler.take_unwritten(), []);
            text_of(&buffer)
        };
        for spec in [None, Some("warn"), Some("not a filter ==")] {
            let text = shown(spec);
            assert_eq!(text.matches("parse error").count(), 10, "{text}");
            assert_eq!(text.matches("framing error").count(), 10, "{text}");
            assert_eq!(text.matches("kept").count(), 25, "{text}");
            assert!(!text.contains("informed"), "{text}");
        }
        // The hint is the asked filter's: nothing below `warn` reaches a layer.
        assert_eq!(
            Filter::<tracing_subscriber::Registry>::max_level_hint(&filter(None).and(Sampler::default())),
            Some(LevelFilter::WARN)
        );
        let text = shown(Some("info,actix_http=off"));
        assert_eq!(text.matches("informed").count(), 25);
        assert!(!text.contains("parse error"), "{text}");
    }

    #[test]
    fn format_names() {
        assert_eq!(Format::parse("JSON"), Some(Format::Json));
        assert_eq!(Format::parse(""), Some(Format::Text));
        assert_eq!(Format::parse("text"), Some(Format::Text));
        assert_eq!(Format::parse("xml"), None);
    }
}
