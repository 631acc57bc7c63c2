//! How durations and times read on the command line and print: the
//! console's (`src/console/time.rs`), and the pauses.

#[path = "../../console/time.rs"]
mod time;

pub(crate) use time::{parse_age, rfc3339};

use std::time::Duration;

/// `10ms`, `1s`.
pub(crate) fn parse_pause(text: &str) -> Result<Duration, String> {
    let (number, scale) = if let Some(ms) = text.strip_suffix("ms") {
        (ms, 1)
    } else if let Some(s) = text.strip_suffix('s') {
        (s, 1000)
    } else {
        return Err(format!("`{text}`: give a pause in ms or s (e.g. 10ms)"));
    };
    let n: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` does not start with a number (e.g. 10ms)"))?;
    Ok(Duration::from_millis(n.saturating_mul(scale)))
}

/// A duration as its largest whole unit.
pub(crate) fn human(d: Duration) -> String {
    let s = d.as_secs();
    for (unit, size) in [("w", 7 * 86_400), ("d", 86_400), ("h", 3600), ("m", 60)] {
        if s >= size && s % size == 0 {
            return format!("{}{unit}", s / size);
        }
    }
    format!("{s}s")
}

/// What the summary line of a command run for one of several tenants
/// starts with (`tenant NAME: `); none otherwise.
static LINE_PREFIX: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// Sets [`line_prefix`] (`--tenants`).
pub(crate) fn set_line_prefix(prefix: Option<String>) {
    *LINE_PREFIX.lock().unwrap_or_else(|e| e.into_inner()) = prefix;
}

/// The prefix of a summary line: `tenant NAME: ` under `--tenants`.
pub(crate) fn line_prefix() -> String {
    LINE_PREFIX
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_parse_and_durations_print() {
        assert_eq!(human(Duration::from_secs(30 * 86_400)), "30d");
        assert_eq!(human(Duration::from_secs(600)), "10m");
        assert_eq!(human(Duration::from_secs(61)), "61s");
        assert_eq!(parse_pause("10ms"), Ok(Duration::from_millis(10)));
        assert_eq!(parse_pause("2s"), Ok(Duration::from_secs(2)));
        assert!(parse_pause("10").is_err());
        assert!(parse_pause("xms").is_err());
    }
}
