//! The WAL relay's replication connection ([`Relay::wal`](super::Relay::wal)):
//! `START_REPLICATION` on the WAL outbox's slot, over PostgreSQL's
//! streaming replication protocol. The server decodes each transaction
//! once, as it commits, and sends it; the relay tells it how far it
//! published (its standby status), which is where the slot resumes after a
//! crash. Reading the slot through SQL instead decodes the WAL again from
//! the slot's restart point on every read.
//!
//! No TLS (as diesel-async's own connections): a server that demands it
//! refuses the connection, with its own words.

use bytes::{Buf, BufMut, BytesMut};
use inbox_runtime::outbox as steps;
use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256, SCRAM_SHA_256};
use postgres_protocol::message::frontend;
use std::io;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// How long opening the connection and starting the stream may take.
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a read waits for the server to move on (send a transaction,
/// or tell a later position) before it gives up on the connection.
const STALL_TIMEOUT: Duration = Duration::from_secs(30);
/// While it waits, how often a read asks the server where it is.
const ASK_EVERY: Duration = Duration::from_millis(50);

/// Where to connect: parsed from a `postgres://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) user: String,
    pub(crate) password: Option<String>,
    pub(crate) database: String,
}

impl Target {
    /// `postgres://user:password@host:port/database` (or `postgresql://`),
    /// with `%`-escapes; `host` and `port` may also come from the query
    /// string (`?host=/run/postgresql` for a Unix socket's directory).
    /// Other forms are refused: the error says what is accepted.
    pub(crate) fn parse(url: &str) -> Result<Target, String> {
        let refuse = |why: &str| {
            format!(
                "the WAL relay's URL: {why} (expected postgres://user:password@host:port/database)"
            )
        };
        let rest = url
            .strip_prefix("postgres://")
            .or_else(|| url.strip_prefix("postgresql://"))
            .ok_or_else(|| refuse("not a postgres:// URL"))?;
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match rest.split_once('/') {
            Some((a, p)) => (a, p),
            None => (rest, ""),
        };
        let (credentials, hostport) = match authority.rsplit_once('@') {
            Some((c, h)) => (Some(c), h),
            None => (None, authority),
        };
        let (user, password) = match credentials {
            Some(c) => match c.split_once(':') {
                Some((u, p)) => (decode(u)?, Some(decode(p)?)),
                None => (decode(c)?, None),
            },
            None => (String::new(), None),
        };
        let (mut host, mut port) = if let Some(inner) = hostport.strip_prefix('[') {
            let (h, after) = inner
                .split_once(']')
                .ok_or_else(|| refuse("an unclosed [ in the host"))?;
            (h.to_owned(), after.strip_prefix(':').map(str::to_owned))
        } else {
            match hostport.split_once(':') {
                Some((h, p)) => (decode(h)?, Some(p.to_owned())),
                None => (decode(hostport)?, None),
            }
        };
        if host.contains(',') {
            return Err(refuse("more than one host"));
        }
        let mut user = user;
        let mut password = password;
        let mut database = decode(path)?;
        for pair in query.into_iter().flat_map(|q| q.split('&')) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = decode(value)?;
            match key {
                "host" => host = value,
                "port" => port = Some(value),
                "user" => user = value,
                "password" => password = Some(value),
                "dbname" => database = value,
                "sslmode" if !matches!(value.as_str(), "disable" | "allow" | "prefer") => {
                    return Err(refuse(&format!(
                        "sslmode={value}: the WAL relay's replication connection has no TLS"
                    )));
                }
                _ => {}
            }
        }
        if user.is_empty() {
            return Err(refuse("no user"));
        }
        if host.is_empty() {
            host = "localhost".into();
        }
        if database.is_empty() {
            database = user.clone();
        }
        let port = match port.as_deref() {
            None | Some("") => 5432,
            Some(p) => p
                .parse()
                .map_err(|_| refuse(&format!("the port {p:?} is not a number")))?,
        };
        Ok(Target {
            host,
            port,
            user,
            password,
            database,
        })
    }
}

/// `%`-escapes decoded.
fn decode(s: &str) -> Result<String, String> {
    let mut out = Vec::with_capacity(s.len());
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        if b == b'%' {
            let hex: Vec<u8> = bytes.by_ref().take(2).collect();
            let byte = std::str::from_utf8(&hex)
                .ok()
                .filter(|h| h.len() == 2)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("the WAL relay's URL: a bad %-escape in {s:?}"))?;
            out.push(byte);
        } else {
            out.push(b);
        }
    }
    String::from_utf8(out).map_err(|_| format!("the WAL relay's URL: {s:?} is not UTF-8"))
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// What a read of the stream brought: `pgoutput`'s messages of whole
/// transactions, in commit order, and the position the relay may confirm
/// once they are published (`None`: nothing new to confirm).
#[derive(Debug, Default)]
pub(crate) struct Chunk {
    pub(crate) messages: Vec<Vec<u8>>,
    pub(crate) end: Option<u64>,
}

/// A replication connection streaming the slot.
pub(crate) struct Stream {
    io: Box<dyn Io>,
    input: BytesMut,
    /// The transaction being received (`Begin` seen, no `Commit` yet).
    open: Option<Vec<Vec<u8>>>,
    /// Where the stream is: the end of the last whole transaction, or the
    /// server's position in a keepalive received with no transaction open.
    at: u64,
    /// What the relay confirmed (published, or kept aside).
    confirmed: u64,
}

impl Stream {
    /// Connects to `target` and starts streaming `slot` from its confirmed
    /// position.
    pub(crate) async fn open(target: &Target, slot: &str) -> io::Result<Stream> {
        tokio::time::timeout(OPEN_TIMEOUT, Self::open_now(target, slot))
            .await
            .map_err(|_| {
                other(format!(
                    "the WAL relay's replication connection to {}:{} did not open within {:?}",
                    target.host, target.port, OPEN_TIMEOUT
                ))
            })?
    }

    async fn open_now(target: &Target, slot: &str) -> io::Result<Stream> {
        let io: Box<dyn Io> = if target.host.starts_with('/') {
            #[cfg(unix)]
            {
                let path = format!("{}/.s.PGSQL.{}", target.host, target.port);
                Box::new(tokio::net::UnixStream::connect(path).await?)
            }
            #[cfg(not(unix))]
            return Err(other(
                "a Unix socket's directory as host, on a system without them",
            ));
        } else {
            let stream =
                tokio::net::TcpStream::connect((target.host.as_str(), target.port)).await?;
            stream.set_nodelay(true)?;
            Box::new(stream)
        };
        let mut stream = Stream {
            io,
            input: BytesMut::with_capacity(64 * 1024),
            open: None,
            at: 0,
            confirmed: 0,
        };
        stream.start_up(target).await?;
        let mut out = BytesMut::new();
        frontend::query(&steps::wal_start_replication(slot), &mut out)?;
        stream.io.write_all(&out).await?;
        loop {
            let (tag, body) = stream.frame().await?;
            match tag {
                b'W' => return Ok(stream),
                b'E' => return Err(server_error(&body)),
                _ => {}
            }
        }
    }

    /// The startup message and the password exchange, up to the server's
    /// first ReadyForQuery.
    async fn start_up(&mut self, target: &Target) -> io::Result<()> {
        let mut out = BytesMut::new();
        frontend::startup_message(
            [
                ("user", target.user.as_str()),
                ("database", target.database.as_str()),
                ("replication", "database"),
                ("application_name", "diesel-inbox WAL relay"),
            ],
            &mut out,
        )?;
        self.io.write_all(&out).await?;
        let password = || {
            target.password.as_deref().ok_or_else(|| {
                other("the server asks for a password and the WAL relay's URL has none")
            })
        };
        let mut scram: Option<ScramSha256> = None;
        loop {
            let (tag, mut body) = self.frame().await?;
            match tag {
                b'R' => {
                    let mut out = BytesMut::new();
                    match body.get_i32() {
                        0 => continue,
                        3 => frontend::password_message(password()?.as_bytes(), &mut out)?,
                        5 => {
                            let mut salt = [0; 4];
                            body.copy_to_slice(&mut salt);
                            let hash = postgres_protocol::authentication::md5_hash(
                                target.user.as_bytes(),
                                password()?.as_bytes(),
                                salt,
                            );
                            frontend::password_message(hash.as_bytes(), &mut out)?;
                        }
                        10 => {
                            let offered = body[..].split(|&b| b == 0).any(|m| m == SCRAM_SHA_256.as_bytes());
                            if !offered {
                                return Err(other(
                                    "the server offers no SASL mechanism the WAL relay speaks (SCRAM-SHA-256 without channel binding)",
                                ));
                            }
                            let s = ScramSha256::new(
                                password()?.as_bytes(),
                                ChannelBinding::unsupported(),
                            );
                            frontend::sasl_initial_response(SCRAM_SHA_256, s.message(), &mut out)?;
                            scram = Some(s);
                        }
                        11 => {
                            let s = scram.as_mut().ok_or_else(|| other("SASL out of order"))?;
                            s.update(&body)?;
                            frontend::sasl_response(s.message(), &mut out)?;
                        }
                        12 => {
                            scram
                                .as_mut()
                                .ok_or_else(|| other("SASL out of order"))?
                                .finish(&body)?;
                            continue;
                        }
                        code => {
                            return Err(other(format!(
                                "the server asks for an authentication the WAL relay does not speak (code {code})"
                            )))
                        }
                    }
                    self.io.write_all(&out).await?;
                }
                b'E' => return Err(server_error(&body)),
                b'Z' => return Ok(()),
                _ => {}
            }
        }
    }

    /// The next message from the server: its tag and body.
    async fn frame(&mut self) -> io::Result<(u8, BytesMut)> {
        loop {
            if self.input.len() >= 5 {
                let len = i32::from_be_bytes(self.input[1..5].try_into().unwrap_or_default());
                let len = usize::try_from(len)
                    .ok()
                    .filter(|&l| l >= 4)
                    .ok_or_else(|| other("a message of the server with a bad length"))?;
                if self.input.len() > len {
                    let mut frame = self.input.split_to(len + 1);
                    let tag = frame[0];
                    frame.advance(5);
                    return Ok((tag, frame));
                }
                self.input.reserve(len + 1 - self.input.len());
            }
            if self.io.read_buf(&mut self.input).await? == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the server closed the WAL relay's replication connection",
                ));
            }
        }
    }

    /// Reads whole transactions until they hold `limit` logical messages,
    /// or until the stream has reached `upto` (the WAL's flushed end when
    /// the read began) with no transaction open. A server that does not
    /// move on for [`STALL_TIMEOUT`] is an error (one that decodes a long
    /// stretch of the business's WAL moves on, and says so when asked).
    pub(crate) async fn read(&mut self, upto: u64, limit: usize) -> io::Result<Chunk> {
        let mut chunk = Chunk::default();
        let mut messages = 0;
        let mut deadline = Instant::now() + STALL_TIMEOUT;
        let mut seen = self.at;
        loop {
            if self.at > seen {
                seen = self.at;
                deadline = Instant::now() + STALL_TIMEOUT;
            }
            if self.open.is_none() && (messages >= limit || self.at >= upto) {
                if self.at > self.confirmed {
                    chunk.end = Some(self.at);
                }
                return Ok(chunk);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(other(format!(
                    "the WAL relay's stream stalled at {} for {:?} (reading up to {})",
                    lsn(self.at),
                    STALL_TIMEOUT,
                    lsn(upto)
                )));
            }
            let frame = match tokio::time::timeout(left.min(ASK_EVERY), self.frame()).await {
                Ok(frame) => frame?,
                Err(_) => {
                    // Nothing for a while: where is the server?
                    self.status(true).await?;
                    continue;
                }
            };
            match frame {
                (b'd', mut body) if body.first() == Some(&b'w') && body.len() > 25 => {
                    body.advance(1 + 8 + 8 + 8);
                    deadline = Instant::now() + STALL_TIMEOUT;
                    let data = body.to_vec();
                    match data.first() {
                        Some(b'B') => self.open = Some(vec![data]),
                        Some(b'C') => {
                            // flags (1), commit lsn (8), end lsn (8).
                            let end = data
                                .get(10..18)
                                .and_then(|b| b.try_into().ok())
                                .map(u64::from_be_bytes)
                                .ok_or_else(|| other("a short Commit message"))?;
                            let mut whole = self
                                .open
                                .take()
                                .ok_or_else(|| other("a Commit without its Begin"))?;
                            whole.push(data);
                            chunk.messages.append(&mut whole);
                            self.at = self.at.max(end);
                        }
                        Some(b'M') => {
                            messages += 1;
                            match self.open.as_mut() {
                                Some(open) => open.push(data),
                                // Not in a transaction: a message someone
                                // else emitted non-transactionally (ours
                                // are transactional).
                                None => chunk.messages.push(data),
                            }
                        }
                        _ => {
                            if let Some(open) = self.open.as_mut() {
                                open.push(data);
                            }
                        }
                    }
                }
                (b'd', mut body) if body.first() == Some(&b'k') && body.len() >= 18 => {
                    body.advance(1);
                    let server = body.get_u64();
                    let _sent_at = body.get_i64();
                    let reply = body.first() == Some(&1);
                    if self.open.is_none() {
                        self.at = self.at.max(server);
                    }
                    if reply {
                        self.status(false).await?;
                    }
                }
                (b'E', body) => return Err(server_error(&body)),
                (b'c', _) => return Err(other("the server ended the WAL relay's stream")),
                _ => {}
            }
        }
    }

    /// Confirms `end` (a [`Chunk::end`]): the slot resumes there after a
    /// crash, and the server may drop the WAL before it.
    pub(crate) async fn confirm(&mut self, end: u64) -> io::Result<()> {
        self.confirmed = self.confirmed.max(end);
        self.status(false).await
    }

    /// The standby status update: received, flushed and applied are all
    /// the confirmed position.
    async fn status(&mut self, reply: bool) -> io::Result<()> {
        let micros = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as i64)
            .unwrap_or_default()
            - PG_EPOCH_MICROS;
        let mut body = BytesMut::with_capacity(34);
        body.put_u8(b'r');
        body.put_u64(self.confirmed);
        body.put_u64(self.confirmed);
        body.put_u64(self.confirmed);
        body.put_i64(micros);
        body.put_u8(u8::from(reply));
        let mut out = BytesMut::with_capacity(40);
        out.put_u8(b'd');
        out.put_i32(body.len() as i32 + 4);
        out.put(body);
        self.io.write_all(&out).await
    }
}

/// PostgreSQL's epoch (2000-01-01) in microseconds after 1970's.
const PG_EPOCH_MICROS: i64 = 946_684_800_000_000;

/// An LSN as PostgreSQL writes it.
fn lsn(at: u64) -> String {
    format!("{:X}/{:X}", at >> 32, at & 0xFFFF_FFFF)
}

fn other(why: impl Into<String>) -> io::Error {
    io::Error::other(why.into())
}

/// An ErrorResponse's severity, code and message.
fn server_error(body: &[u8]) -> io::Error {
    let mut code = "";
    let mut message = "";
    for field in body.split(|&b| b == 0) {
        if let Some((&kind, text)) = field.split_first() {
            let text = std::str::from_utf8(text).unwrap_or("");
            match kind {
                b'C' => code = text,
                b'M' => message = text,
                _ => {}
            }
        }
    }
    other(format!(
        "the WAL relay's replication connection: {message} (SQLSTATE {code})"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse() {
        let t = Target::parse("postgres://me:p%40ss@db.example:6543/shop?sslmode=prefer").unwrap();
        assert_eq!(
            t,
            Target {
                host: "db.example".into(),
                port: 6543,
                user: "me".into(),
                password: Some("p@ss".into()),
                database: "shop".into(),
            }
        );
        let t = Target::parse("postgresql://me@%2Frun%2Fpostgresql/shop").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.password),
            ("/run/postgresql", 5432, None)
        );
        let t = Target::parse("postgres://me@/shop?host=/tmp&port=5433").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("/tmp", 5433));
        let t = Target::parse("postgres://me@[::1]:5433").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.database.as_str()),
            ("::1", 5433, "me")
        );
        for bad in [
            "mysql://me@host/db",
            "host=localhost user=me",
            "postgres://host/db",
            "postgres://me@host:port/db",
            "postgres://me@host/db?sslmode=require",
            "postgres://me@a,b/db",
            "postgres://me@host/d%4",
        ] {
            let why = Target::parse(bad).unwrap_err();
            assert!(why.starts_with("the WAL relay's URL"), "{bad}: {why}");
        }
    }

    #[test]
    fn lsns_read_as_postgresql_writes_them() {
        assert_eq!(lsn(0x1_6B37_4D48), "1/6B374D48");
    }
}
