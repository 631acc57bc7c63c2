//! Which names the console answers to. A page on the web can make a
//! browser send requests to a console on loopback through a name it
//! controls that resolves to 127.0.0.1 (DNS rebinding): the peer is then
//! loopback and the request same-origin for that name. So, unless the
//! user's own `authorize` decides, the console answers only requests whose
//! `Host` is a loopback address, `localhost` (or a name under it), or a
//! name the user allowed ([`ConsoleExt::allow_hosts`](super::ConsoleExt::allow_hosts));
//! anything else gets `421 Misdirected Request`, and nothing runs. An
//! action whose `Origin` names another host than its `Host` is refused.

use super::html::esc;
use super::{AllowedHosts, Authorize};
use axum::http::{header, HeaderMap, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use std::net::IpAddr;

/// The host part of a `Host` value or an origin's authority
/// (`name:port`, `[::1]:port`, `name`), lowercased, without a trailing
/// dot: `None` when it is not one.
pub(super) fn host_name(authority: &str) -> Option<String> {
    let authority = authority.trim();
    let name = match authority.strip_prefix('[') {
        // An IPv6 literal: up to its `]`, then nothing or a port.
        Some(rest) => {
            let (inside, after) = rest.split_once(']')?;
            if !(after.is_empty() || after.strip_prefix(':').is_some_and(is_port)) {
                return None;
            }
            inside
        }
        None => match authority.rsplit_once(':') {
            Some((name, port)) if is_port(port) => name,
            Some(_) => return None,
            None => authority,
        },
    };
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    (!name.is_empty()).then_some(name)
}

fn is_port(port: &str) -> bool {
    !port.is_empty() && port.len() <= 5 && port.bytes().all(|b| b.is_ascii_digit())
}

/// Whether `name` (from [`host_name`]) is loopback by itself: a loopback
/// address, `localhost` or a name under it (which browsers and RFC 6761
/// keep on loopback, whatever DNS says).
fn loopback(name: &str) -> bool {
    name == "localhost"
        || name.ends_with(".localhost")
        || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Why a request's `Host` is not one the console answers to, if it is
/// not: without `authorize`, a loopback name or address, or an allowed
/// name.
fn misdirected(headers: &HeaderMap, allowed: Option<&AllowedHosts>) -> Option<String> {
    let Some(value) = headers.get(header::HOST) else {
        return Some("the request has no Host header".into());
    };
    let shown = String::from_utf8_lossy(value.as_bytes()).into_owned();
    let Some(name) = value.to_str().ok().and_then(host_name) else {
        return Some(format!("the Host header {shown:?} is not a host name"));
    };
    let allowed_name = allowed.is_some_and(|a| a.0.contains(&name));
    if loopback(&name) || allowed_name {
        return None;
    }
    Some(format!(
        "this console answers to localhost, loopback addresses and the names allowed with \
         allow_hosts (--allow-host), not to {name:?}: a web page could reach a console on \
         loopback through a name of its own that resolves there"
    ))
}

/// The layer's check: a console without `authorize` refuses a request
/// for a name it does not answer to (`421`), before any handler runs.
pub(super) async fn check(
    request: Request<axum::body::Body>,
    next: axum::middleware::Next,
) -> Response {
    if request.extensions().get::<Authorize>().is_none() {
        let allowed = request.extensions().get::<AllowedHosts>();
        if let Some(why) = misdirected(request.headers(), allowed) {
            tracing::warn!(target: crate::TRACING_TARGET, reason = %why, "diesel-inbox console: request refused");
            return refusal(&why);
        }
    }
    next.run(request).await
}

/// The `421` answer: a page without links (the name is not the
/// console's) that says why and what to do.
fn refusal(why: &str) -> Response {
    let html = format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>Misdirected · diesel-inbox</title></head><body>\
         <h1>Not this console's name</h1>\
         <p class=\"error\" id=\"misdirected\">Refused: {}.</p>\
         <p>Nothing was read or changed. Open the console at http://localhost:PORT/ or \
         http://127.0.0.1:PORT/, allow the name (<code>allow_hosts</code>, \
         <code>--allow-host</code>), or set <code>authorize</code>.</p></body></html>",
        esc(why)
    );
    (
        StatusCode::MISDIRECTED_REQUEST,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        html,
    )
        .into_response()
}

/// Why an action's `Origin` is refused, if it is: present, and not the
/// origin of the request's own `Host` (`null`, or another host or port).
pub(super) fn foreign_origin(headers: &HeaderMap) -> Option<String> {
    let origin = headers.get(header::ORIGIN)?;
    let origin = String::from_utf8_lossy(origin.as_bytes()).into_owned();
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_ascii_lowercase);
    let authority = origin
        .split_once("://")
        .map(|(_, rest)| rest.to_ascii_lowercase());
    match (authority, host) {
        (Some(authority), Some(host)) if authority == host => None,
        // `http://host:80` and `http://host` are one origin.
        (Some(authority), Some(host))
            if origin.starts_with("http://")
                && (authority.strip_suffix(":80") == Some(&host)
                    || host.strip_suffix(":80") == Some(authority.as_str())) =>
        {
            None
        }
        _ => Some(format!(
            "a request from another origin ({origin:?}) than the console's"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.insert(*name, value.parse().unwrap());
        }
        headers
    }

    #[test]
    fn host_names_are_read_with_or_without_a_port() {
        assert_eq!(host_name("LocalHost:8080").as_deref(), Some("localhost"));
        assert_eq!(host_name("127.0.0.1").as_deref(), Some("127.0.0.1"));
        assert_eq!(host_name("[::1]:80").as_deref(), Some("::1"));
        assert_eq!(
            host_name("example.com.:443").as_deref(),
            Some("example.com")
        );
        assert_eq!(host_name("a:b:c"), None);
        assert_eq!(host_name("[::1"), None);
        assert_eq!(host_name(":80"), None);
    }

    #[test]
    fn only_loopback_and_allowed_names_are_answered() {
        let allowed = AllowedHosts(vec!["ops.internal".into()]);
        for good in [
            "localhost:1",
            "127.0.0.1:9",
            "127.1.2.3",
            "[::1]:8",
            "a.localhost",
            "OPS.internal:8080",
        ] {
            assert_eq!(
                misdirected(&headers(&[("host", good)]), Some(&allowed)),
                None,
                "{good}"
            );
        }
        for bad in [
            "rebind.example:8080",
            "10.0.0.1:8080",
            "[::2]",
            "localhost.evil.com",
            "x:y",
        ] {
            assert!(
                misdirected(&headers(&[("host", bad)]), Some(&allowed)).is_some(),
                "{bad}"
            );
        }
        assert!(misdirected(&HeaderMap::new(), None).is_some());
    }

    #[test]
    fn an_origin_must_be_the_hosts_own() {
        let same = headers(&[
            ("host", "127.0.0.1:8080"),
            ("origin", "http://127.0.0.1:8080"),
        ]);
        assert_eq!(foreign_origin(&same), None);
        assert_eq!(
            foreign_origin(&headers(&[("host", "localhost:8080")])),
            None
        );
        for origin in [
            "http://evil.example",
            "null",
            "http://127.0.0.1:8081",
            "http://localhost:8080",
        ] {
            let other = headers(&[("host", "127.0.0.1:8080"), ("origin", origin)]);
            assert!(foreign_origin(&other).is_some(), "{origin}");
        }
    }
}
