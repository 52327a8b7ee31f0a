//! Log output on stderr: `XINF_LOG` filters it (`tracing` `EnvFilter` syntax, `warn` when
//! unset or invalid), `XINF_LOG_FORMAT=json` writes one JSON object per line for log
//! collectors, anything else readable text. Colours only go to a terminal, so that files and
//! pipes get no escape codes.

use std::io::IsTerminal;
use tracing::Subscriber;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::util::SubscriberInitExt;

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

/// Where actix logs, at ERROR, each connection whose bytes are not an HTTP request it can parse
/// (garbage, HTTP/0.9, an over-long URI). The client has its 400 already; a line per such
/// connection would let anyone fill the log, so it is silenced unless `XINF_LOG` names
/// `actix_http` itself.
const CLIENT_NOISE: &str = "actix_http::h1::dispatcher=off";

/// The filter `XINF_LOG` (`spec`) asks for, `warn` when unset or invalid, with actix's lines
/// for unparseable requests off unless it names them.
fn filter(spec: Option<&str>) -> EnvFilter {
    let filter = spec.and_then(|s| EnvFilter::try_new(s).ok()).unwrap_or_else(|| EnvFilter::new("warn"));
    match spec {
        Some(s) if s.contains("actix_http") => filter,
        _ => CLIENT_NOISE.parse().map(|d| filter.add_directive(d)).unwrap_or_else(|_| EnvFilter::new("warn")),
    }
}

/// Installs the process's log subscriber (once; later calls do nothing).
pub(crate) fn init() {
    let filter = filter(std::env::var("XINF_LOG").ok().as_deref());
    let raw = std::env::var("XINF_LOG_FORMAT").unwrap_or_default();
    let format = Format::parse(&raw);
    let ansi = std::io::stderr().is_terminal();
    let installed = subscriber(format.unwrap_or(Format::Text), ansi, filter, std::io::stderr).try_init();
    if installed.is_ok() && format.is_none() {
        tracing::warn!(value = %raw, "XINF_LOG_FORMAT is neither `text` nor `json`; writing text");
    }
}

/// The subscriber writing `format` lines that pass `filter` to `writer`.
fn subscriber<W>(
    format: Format,
    ansi: bool,
    filter: EnvFilter,
    writer: W,
) -> Box<dyn Subscriber + Send + Sync>
where
    W: for<'a> MakeWriter<'a> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(writer).with_ansi(ansi);
    match format {
        Format::Text => Box::new(builder.finish()),
        // JSON never carries colour codes, whatever `ansi` says.
        Format::Json => Box::new(builder.with_ansi(false).json().finish()),
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

    fn capture(format: Format, ansi: bool) -> String {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let sub = subscriber(format, ansi, EnvFilter::new("info"), move || writer.clone());
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

    /// Lines actix writes for requests it cannot parse are off by default, and kept when
    /// `XINF_LOG` names `actix_http`; the rest of the filter is as asked.
    #[test]
    fn unparseable_requests_are_not_logged_unless_asked() {
        let shown = |spec: Option<&str>| {
            let buffer = Buffer::default();
            let writer = buffer.clone();
            let sub = subscriber(Format::Text, false, filter(spec), move || writer.clone());
            tracing::subscriber::with_default(sub, || {
                tracing::error!(target: "actix_http::h1::dispatcher", "stream error: request parse error");
                tracing::warn!(target: "xinf::api", "kept");
                tracing::info!(target: "xinf::api", "informed");
            });
            let bytes = buffer.0.lock().map(|b| b.clone()).unwrap_or_default();
            String::from_utf8_lossy(&bytes).into_owned()
        };
        for spec in [None, Some("warn"), Some("not a filter ==")] {
            let text = shown(spec);
            assert!(
                text.contains("kept") && !text.contains("parse error") && !text.contains("informed"),
                "{text}"
            );
        }
        let text = shown(Some("info"));
        assert!(text.contains("informed") && !text.contains("parse error"), "{text}");
        assert!(shown(Some("warn,actix_http=error")).contains("parse error"));
    }

    #[test]
    fn format_names() {
        assert_eq!(Format::parse("JSON"), Some(Format::Json));
        assert_eq!(Format::parse(""), Some(Format::Text));
        assert_eq!(Format::parse("text"), Some(Format::Text));
        assert_eq!(Format::parse("xml"), None);
    }
}
