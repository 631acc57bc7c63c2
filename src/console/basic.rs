//! HTTP Basic credentials and a comparison of secrets: the console's log
//! of who acted, and the CLI's `--token` (which includes this file).

use axum::http::{header, HeaderMap};

/// The user and password of an `Authorization: Basic` header.
pub(crate) fn basic_credentials(headers: &HeaderMap) -> Option<(String, String)> {
    let encoded = headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Basic ")?;
    let decoded = decode_base64(encoded.trim())?;
    let (user, password) = decoded.split_once(':')?;
    Some((user.to_owned(), password.to_owned()))
}

/// Standard base64.
fn decode_base64(text: &str) -> Option<String> {
    let mut bits = 0u32;
    let mut count = 0;
    let mut out = Vec::new();
    for c in text.bytes().take_while(|&c| c != b'=') {
        let value = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        };
        bits = (bits << 6) | u32::from(value);
        count += 6;
        if count >= 8 {
            count -= 8;
            out.push((bits >> count) as u8);
        }
    }
    String::from_utf8(out).ok()
}

/// The same bytes, compared in a time that does not depend on where they
/// differ.
pub(crate) fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_credentials_decode() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::AUTHORIZATION,
            "Basic YWxpY2U6c2VjcmV0".parse().unwrap(),
        );
        assert_eq!(
            basic_credentials(&headers),
            Some(("alice".to_owned(), "secret".to_owned()))
        );
        assert_eq!(decode_base64("b3A6eA==").as_deref(), Some("op:x"));
        assert_eq!(decode_base64("!!"), None);
        assert!(
            same_secret("abc", "abc") && !same_secret("abc", "abd") && !same_secret("abc", "ab")
        );
    }
}
