//! What is stored of a response, how, and the response a first request
//! gets back after its body was read for storing.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderName, HeaderValue, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

/// The headers always stored with a response: what a replay needs to mean
/// the same (`Content-Encoding`: the stored bytes are encoded).
pub(crate) const ALWAYS_STORED: [HeaderName; 4] = [
    http::header::CONTENT_TYPE,
    http::header::LOCATION,
    http::header::ETAG,
    http::header::CONTENT_ENCODING,
];

/// A response as stored in the inbox row: status, the stored headers (in
/// order, repeated names kept), and the body bytes unless the body was
/// over the cap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoredResponse {
    pub(crate) status: StatusCode,
    pub(crate) headers: Vec<(HeaderName, HeaderValue)>,
    /// `None`: the body was over `max_stored_body` and is not stored.
    pub(crate) body: Option<Bytes>,
}

/// The stored form's first byte (its version).
const FORMAT: u8 = 1;

impl StoredResponse {
    /// The stored bytes: the format byte, the status (u16), the header
    /// count (u16), each header as a name (u16 length, bytes) and a value
    /// (u32 length, bytes), then a flag (1: body stored) and the body (u32
    /// length, bytes). Lossless: binary bodies and header values
    /// byte for byte.
    pub(crate) fn encode(&self) -> Result<Vec<u8>, String> {
        let body = self.body.as_ref().map_or(0, Bytes::len);
        let mut out = BytesMut::with_capacity(16 + body);
        out.put_u8(FORMAT);
        out.put_u16(self.status.as_u16());
        out.put_u16(u16::try_from(self.headers.len()).map_err(|_| "too many headers")?);
        for (name, value) in &self.headers {
            out.put_u16(u16::try_from(name.as_str().len()).map_err(|_| "header name too long")?);
            out.put_slice(name.as_str().as_bytes());
            out.put_u32(u32::try_from(value.len()).map_err(|_| "header value too long")?);
            out.put_slice(value.as_bytes());
        }
        match &self.body {
            None => out.put_u8(0),
            Some(body) => {
                out.put_u8(1);
                out.put_u32(u32::try_from(body.len()).map_err(|_| "body over 4 GiB")?);
                out.put_slice(body);
            }
        }
        Ok(out.to_vec())
    }

    /// Reads [`encode`](Self::encode)'s bytes back.
    pub(crate) fn decode(mut bytes: &[u8]) -> Result<Self, String> {
        fn take<'a>(bytes: &mut &'a [u8], n: usize) -> Result<&'a [u8], String> {
            if bytes.len() < n {
                return Err("the stored response is cut short".into());
            }
            let (head, rest) = bytes.split_at(n);
            *bytes = rest;
            Ok(head)
        }
        let format = take(&mut bytes, 1)?[0];
        if format != FORMAT {
            return Err(format!(
                "not a stored HTTP response of this release (format byte {format})"
            ));
        }
        let status =
            StatusCode::from_u16(take(&mut bytes, 2)?.get_u16()).map_err(|e| e.to_string())?;
        let count = take(&mut bytes, 2)?.get_u16();
        let mut headers = Vec::with_capacity(usize::from(count));
        for _ in 0..count {
            let len = usize::from(take(&mut bytes, 2)?.get_u16());
            let name = HeaderName::from_bytes(take(&mut bytes, len)?).map_err(|e| e.to_string())?;
            let len = take(&mut bytes, 4)?.get_u32() as usize;
            let value =
                HeaderValue::from_bytes(take(&mut bytes, len)?).map_err(|e| e.to_string())?;
            headers.push((name, value));
        }
        let body = match take(&mut bytes, 1)?[0] {
            0 => None,
            _ => {
                let len = take(&mut bytes, 4)?.get_u32() as usize;
                Some(Bytes::copy_from_slice(take(&mut bytes, len)?))
            }
        };
        if !bytes.is_empty() {
            return Err("the stored response has bytes after its end".into());
        }
        Ok(StoredResponse {
            status,
            headers,
            body,
        })
    }

    /// The replay: the stored status, headers and body (empty when it was
    /// not stored), with `Idempotent-Replayed: true`.
    pub(crate) fn replay(self) -> Response<Bytes> {
        let mut response = Response::new(self.body.unwrap_or_default());
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        for (name, value) in self.headers {
            headers.append(name, value);
        }
        headers.insert(super::IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
        response
    }
}

/// Reads `response`'s body, up to `max_body` bytes, for storing (inside
/// the transaction): what is stored, and the response the first request
/// returns (every header, the whole body: what was read, then the rest).
pub(crate) async fn capture<B>(
    response: Response<B>,
    max_body: usize,
    stored_headers: &[HeaderName],
) -> Result<(StoredResponse, Response<Replay<B>>), String>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let (parts, mut body) = response.into_parts();
    let mut frames = VecDeque::new();
    let mut read = 0usize;
    let mut ended = false;
    while read <= max_body {
        let frame = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await;
        match frame {
            None => {
                ended = true;
                break;
            }
            Some(Err(e)) => return Err(format!("the response body failed: {e}")),
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    read += data.len();
                }
                frames.push_back(frame);
            }
        }
    }
    let stored_body = (ended && read <= max_body).then(|| {
        let mut all = BytesMut::with_capacity(read);
        for frame in &frames {
            if let Some(data) = frame.data_ref() {
                all.put_slice(data);
            }
        }
        all.freeze()
    });
    let mut headers = Vec::new();
    for name in ALWAYS_STORED.iter().chain(stored_headers) {
        if headers.iter().any(|(stored, _)| stored == name) {
            continue;
        }
        for value in parts.headers.get_all(name) {
            headers.push((name.clone(), value.clone()));
        }
    }
    let stored = StoredResponse {
        status: parts.status,
        headers,
        body: stored_body,
    };
    let rest = (!ended).then_some(body);
    Ok((stored, Response::from_parts(parts, Replay { frames, rest })))
}

/// The body of a first request's response: the frames read for storing,
/// then the rest of the handler's body (when it was over the cap).
pub(crate) struct Replay<B> {
    frames: VecDeque<Frame<Bytes>>,
    rest: Option<B>,
}

impl<B> Body for Replay<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        if let Some(frame) = self.frames.pop_front() {
            return Poll::Ready(Some(Ok(frame)));
        }
        match self.rest.as_mut() {
            Some(rest) => Pin::new(rest).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty() && self.rest.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        let buffered: u64 = self
            .frames
            .iter()
            .filter_map(|f| f.data_ref().map(|d| d.len() as u64))
            .sum();
        match &self.rest {
            None => SizeHint::with_exact(buffered),
            Some(rest) => {
                let hint = rest.size_hint();
                let mut sum = SizeHint::new();
                sum.set_lower(hint.lower() + buffered);
                if let Some(upper) = hint.upper() {
                    sum.set_upper(upper + buffered);
                }
                sum
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_response_reads_back_byte_for_byte() {
        let stored = StoredResponse {
            status: StatusCode::CREATED,
            headers: vec![
                (
                    http::header::LOCATION,
                    HeaderValue::from_static("/payments/7"),
                ),
                (
                    HeaderName::from_static("x-tag"),
                    HeaderValue::from_bytes(b"\xff\x80a").unwrap(),
                ),
                (
                    HeaderName::from_static("x-tag"),
                    HeaderValue::from_static("b"),
                ),
            ],
            body: Some(Bytes::from_static(b"\x00\x01\xfe\xffbinary")),
        };
        let bytes = stored.encode().unwrap();
        assert_eq!(StoredResponse::decode(&bytes).unwrap(), stored);
        let omitted = StoredResponse {
            body: None,
            ..stored
        };
        assert_eq!(
            StoredResponse::decode(&omitted.encode().unwrap()).unwrap(),
            omitted
        );
        assert!(StoredResponse::decode(&bytes[..bytes.len() - 1]).is_err());
        assert!(StoredResponse::decode(b"{\"json\":1}").is_err());
    }
}
