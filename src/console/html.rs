//! The console's HTML: escaping (every value from the database goes
//! through [`esc`]), the page around each view, the stylesheet, the live
//! script, the rate charts (SVG) and the forms of the actions.

use super::Context;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use std::fmt::Write;

/// `text` as HTML text or attribute value: `&`, `<`, `>`, `"` and `'`
/// escaped, so that a payload of `<script>` is shown, never run.
pub(super) fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `text` as a query-string value.
pub(super) fn url(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(byte as char)
            }
            _ => {
                let _ = write!(out, "%{byte:02X}");
            }
        }
    }
    out
}

/// Which view a page is, for the navigation.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum View {
    Overview,
    Dead,
    Lookup,
    /// The tenants' overview (its navigation is its own link).
    Tenants,
}

/// A whole page: the navigation, a notice (an action's result) and
/// `body`.
pub(super) fn page(
    status: StatusCode,
    context: &Context,
    view: View,
    notice: Option<&str>,
    body: &str,
) -> Response {
    let base = context.base.as_str();
    let link = |target: View, path: &str, name: &str| {
        // Mounted, the overview is `/ops` under `.nest("/ops", ..)` and
        // `/ops/` under `.nest("/ops/", ..)` (axum routes a nested `/` at
        // the prefix as written), which no page but the overview can tell
        // apart: its link is its other route, `/ops/overview`, which both
        // route.
        let path = match (base.is_empty(), path) {
            (false, "/") => "/overview",
            _ => path,
        };
        format!(
            "<a href=\"{}{path}\"{}>{name}</a>",
            esc(base),
            if target == view {
                " class=\"current\""
            } else {
                ""
            }
        )
    };
    let title = match view {
        View::Overview => "Overview",
        View::Dead => "Dead messages",
        View::Lookup => "Lookup",
        View::Tenants => "Tenants",
    };
    let nav = match view {
        View::Tenants => link(View::Tenants, "/", "Tenants"),
        _ => format!(
            "{} {} {}",
            link(View::Overview, "/", "Overview"),
            link(View::Dead, "/dead", "Dead messages"),
            link(View::Lookup, "/lookup", "Lookup"),
        ),
    };
    let notice = notice.map_or(String::new(), |n| {
        format!("<p class=\"notice\" id=\"notice\">{}</p>", esc(n))
    });
    // A tenant's pages name it, and link back to the tenants' overview
    // (mounted: its `/overview` route, as `link` above).
    let (crumb, of) = match &context.tenant {
        Some(tenant) => {
            let overview = match tenant.tenants_base.is_empty() {
                true => "/".to_owned(),
                false => format!("{}/overview", tenant.tenants_base),
            };
            (
                format!(
                    "<span class=\"tenant\" id=\"tenant\"><a href=\"{}\">Tenants</a> › <strong>{}</strong></span> ",
                    esc(&overview),
                    esc(&tenant.name)
                ),
                format!(" · {}", esc(&tenant.name)),
            )
        }
        None => (String::new(), String::new()),
    };
    let html = format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width\">\
         <title>{title}{of} · diesel-inbox</title>\
         <link rel=\"stylesheet\" href=\"{base}/console.css\">\
         <script src=\"{base}/console.js\" defer></script></head>\
         <body><header><strong>diesel-inbox</strong> {crumb}<nav>{nav}</nav></header>\
         <main><h1>{title}</h1>{notice}{body}</main></body></html>",
        base = esc(base),
    );
    (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        html,
    )
        .into_response()
}

/// The page of a database that did not answer.
pub(super) fn unavailable(context: &Context, view: View, why: &str) -> Response {
    page(
        StatusCode::SERVICE_UNAVAILABLE,
        context,
        view,
        None,
        &format!(
            "<p class=\"error\" id=\"unavailable\">The console could not read the database: {}</p>\
             <p>Nothing was changed. Reload the page to try again.</p>",
            esc(why)
        ),
    )
}

/// A duration as its two largest units: `26s`, `59m 33s`, `2h 5m`,
/// `3d 4h`.
pub(super) fn age(d: std::time::Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {}s", s / 60, s % 60),
        3600..86_400 => format!("{}h {}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d {}h", s / 86_400, s % 86_400 / 3600),
    }
}

/// A minute's rows, marked `≥` where a lower bound (a minute of more than
/// [`RATE_CAP`](crate::RATE_CAP) rows, of which the console counts the
/// first).
pub(super) fn rate(n: u64, at_least: bool) -> String {
    if at_least {
        format!(
            "<span class=\"at-least\" title=\"at least: the console counts the first {} rows of a minute; `diesel-inbox stats` counts all\">&ge;{n}</span>",
            crate::RATE_CAP
        )
    } else {
        n.to_string()
    }
}

/// A small bar chart of `per_minute` (oldest first), drawn on the server;
/// the bars of minutes counted in part say so.
pub(super) fn chart(per_minute: &[u64], at_least: &[bool]) -> String {
    let (width, height) = (3 * per_minute.len(), 24usize);
    let max = per_minute.iter().copied().max().unwrap_or(0).max(1);
    let mut svg = format!(
        "<svg class=\"chart\" width=\"{width}\" height=\"{height}\" viewBox=\"0 0 {width} {height}\" \
         role=\"img\" aria-label=\"rows per minute, the last {} minutes\">",
        per_minute.len()
    );
    for (i, n) in per_minute.iter().enumerate() {
        let h = if *n == 0 {
            0
        } else {
            ((*n as f64 / max as f64) * (height - 1) as f64).ceil() as usize
        };
        let _ = write!(
            svg,
            "<rect x=\"{}\" y=\"{}\" width=\"2\" height=\"{h}\"><title>{}{n}</title></rect>",
            3 * i,
            height - h,
            if at_least.get(i).copied().unwrap_or(false) {
                "\u{2265}"
            } else {
                ""
            }
        );
    }
    svg.push_str("</svg>");
    svg
}

/// A form that POSTs one action with the CSRF token and `fields`.
pub(super) fn action(
    base: &str,
    csrf: &str,
    action: &str,
    label: &str,
    fields: &[(&str, &str)],
) -> String {
    let mut form = format!(
        "<form class=\"action\" method=\"post\" action=\"{}/actions/{action}\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{}\">",
        esc(base),
        esc(csrf)
    );
    for (name, value) in fields {
        let _ = write!(
            form,
            "<input type=\"hidden\" name=\"{name}\" value=\"{}\">",
            esc(value)
        );
    }
    let _ = write!(
        form,
        "<button type=\"submit\" name=\"do\" value=\"{action}\">{label}</button></form>"
    );
    form
}

/// A payload as text when all of it is UTF-8, else as a hex dump: at most
/// 64 KiB of it, a text cut at a character boundary.
pub(super) fn payload(bytes: &[u8]) -> String {
    const SHOWN: usize = 64 * 1024;
    let cut = |shown: usize| match shown < bytes.len() {
        true => format!(" (the first {shown} of {} bytes)", bytes.len()),
        false => String::new(),
    };
    match std::str::from_utf8(bytes) {
        Ok(text) => {
            let mut end = text.len().min(SHOWN);
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            format!(
                "<p class=\"muted\">text, {} bytes{}</p><pre class=\"payload\">{}</pre>",
                bytes.len(),
                cut(end),
                esc(&text[..end])
            )
        }
        Err(_) => {
            let shown = &bytes[..bytes.len().min(SHOWN)];
            let mut dump = String::new();
            for (line, chunk) in shown.chunks(16).enumerate() {
                let _ = write!(dump, "{:08x} ", line * 16);
                for byte in chunk {
                    let _ = write!(dump, " {byte:02x}");
                }
                dump.push('\n');
            }
            format!(
                "<p class=\"muted\">binary, {} bytes{}</p><pre class=\"payload\">{dump}</pre>",
                bytes.len(),
                cut(shown.len())
            )
        }
    }
}

/// The stylesheet (a file, so that the pages need no inline style).
pub(super) async fn stylesheet() -> Response {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("console.css"),
    )
        .into_response()
}

/// The live update of the overview: every five seconds the page fetches
/// its tables again and says when the database does not answer.
pub(super) async fn script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("console.js"),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_text_is_escaped() {
        assert_eq!(
            esc("<script>alert('x')</script> & \"q\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;q&quot;"
        );
        assert_eq!(url("a b&c=d/é"), "a%20b%26c%3Dd%2F%C3%A9");
    }

    #[test]
    fn payloads_show_as_text_or_hex() {
        assert!(payload(b"<b>hi</b>").contains("&lt;b&gt;hi&lt;/b&gt;"));
        let hex = payload(&[0xff, 0x00, 0x41]);
        assert!(hex.contains("binary, 3 bytes") && hex.contains("00000000  ff 00 41"));
    }

    #[test]
    fn a_long_text_is_cut_at_a_character_boundary() {
        // 10 MB of a three-byte character: the 64 KiB cut lands inside one.
        let text = "€".repeat(10_000_000 / 3);
        let shown = payload(text.as_bytes());
        assert!(
            shown.starts_with("<p class=\"muted\">text, 9999999 bytes"),
            "{}",
            &shown[..80]
        );
        assert!(shown.contains("(the first 65535 of 9999999 bytes)"));
        // Not UTF-8 only past the cut: still binary.
        let mut bytes = vec![b'a'; 70_000];
        bytes.push(0xff);
        assert!(payload(&bytes).contains("binary, 70001 bytes"));
    }

    #[test]
    fn ages_read_in_two_units() {
        use std::time::Duration;
        assert_eq!(age(Duration::from_secs(26)), "26s");
        assert_eq!(age(Duration::from_secs(3573)), "59m 33s");
        assert_eq!(age(Duration::from_secs(7500)), "2h 5m");
        assert_eq!(age(Duration::from_secs(3 * 86_400 + 4 * 3600 + 5)), "3d 4h");
    }

    #[test]
    fn charts_scale_to_their_largest_minute() {
        let svg = chart(&[0, 5, 10], &[false, false, true]);
        assert!(svg.contains("height=\"23\"><title>\u{2265}10</title>"));
        assert!(svg.contains("height=\"12\"><title>5</title>"));
        assert_eq!(rate(7, false), "7");
        assert!(rate(7, true).contains("&ge;7"));
        assert!(svg.contains("height=\"0\"><title>0</title>"));
    }
}
