//! How a row stores a message's headers.

/// Headers as stored: each name and value as a 4-byte little-endian length
/// and its UTF-8 bytes; `None` without headers.
pub(super) fn encode_headers(headers: &[(String, String)]) -> Option<Vec<u8>> {
    if headers.is_empty() {
        return None;
    }
    let mut out = Vec::new();
    for (name, value) in headers {
        for part in [name, value] {
            out.extend_from_slice(&(part.len() as u32).to_le_bytes());
            out.extend_from_slice(part.as_bytes());
        }
    }
    Some(out)
}

pub(super) fn decode_headers(bytes: Option<&[u8]>) -> Vec<(String, String)> {
    let mut rest = bytes.unwrap_or_default();
    let mut take = || -> Option<String> {
        let len = u32::from_le_bytes(rest.get(..4)?.try_into().ok()?) as usize;
        let text = String::from_utf8_lossy(rest.get(4..4 + len)?).into_owned();
        rest = &rest[4 + len..];
        Some(text)
    };
    let mut headers = Vec::new();
    while let (Some(name), Some(value)) = (take(), take()) {
        headers.push((name, value));
    }
    headers
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip() {
        let headers = vec![
            ("content-type".to_owned(), "application/json".to_owned()),
            ("x-empty".to_owned(), String::new()),
        ];
        assert_eq!(decode_headers(encode_headers(&headers).as_deref()), headers);
        assert_eq!(encode_headers(&[]), None);
        assert!(decode_headers(None).is_empty());
    }
}
