//! How durations and times read on the command line and print: the
//! console's (`src/console/time.rs`), and the pauses.

#[path = "../../console/time.rs"]
mod time;

pub(crate) use time::{human, parse_age, rfc3339};

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_parse() {
        assert_eq!(parse_pause("10ms"), Ok(Duration::from_millis(10)));
        assert_eq!(parse_pause("2s"), Ok(Duration::from_secs(2)));
        assert!(parse_pause("10").is_err());
        assert!(parse_pause("xms").is_err());
    }
}
