//! A TCP proxy between a consumer process and PostgreSQL that can stop
//! forwarding: `Refuse` closes every connection (an outage that fails
//! fast), `Blackhole` accepts and keeps connections but forwards nothing
//! (a stalled server: a pool's `get` then waits forever). `switch` points
//! new connections at another server (a virtual IP or a DNS name moved by
//! a failover). Threads and std sockets; loopback only.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Mode {
    Forward = 0,
    Refuse = 1,
    Blackhole = 2,
}

impl Mode {
    fn of(value: u8) -> Mode {
        match value {
            0 => Mode::Forward,
            1 => Mode::Refuse,
            _ => Mode::Blackhole,
        }
    }
}

struct Shared {
    mode: AtomicU8,
    stopped: AtomicBool,
    upstream: Mutex<SocketAddr>,
}

impl Shared {
    fn mode(&self) -> Mode {
        Mode::of(self.mode.load(Ordering::SeqCst))
    }
}

pub struct Proxy {
    pub port: u16,
    shared: Arc<Shared>,
}

impl Proxy {
    /// A proxy on a free loopback port to `upstream`, forwarding.
    pub fn start(upstream: SocketAddr) -> Result<Proxy, String> {
        let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        let shared = Arc::new(Shared {
            mode: AtomicU8::new(Mode::Forward as u8),
            stopped: AtomicBool::new(false),
            upstream: Mutex::new(upstream),
        });
        let accepting = shared.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if accepting.stopped.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = client else { continue };
                let shared = accepting.clone();
                std::thread::spawn(move || serve(client, &shared));
            }
        });
        Ok(Proxy { port, shared })
    }

    /// `url` (a URL of the upstream server on 127.0.0.1, its port written
    /// or its scheme's default) through the proxy. A `mysql://` URL also
    /// gets `prefer_socket=false`: mysql_async moves a loopback connection
    /// onto the server's Unix socket after the handshake, which would
    /// bypass the proxy.
    pub fn route(&self, url: &str) -> Result<String, String> {
        let upstream = *self.shared.upstream.lock().expect("the upstream");
        let through = format!("127.0.0.1:{}/", self.port);
        let routed =
            url.replacen(&format!("{upstream}/"), &through, 1)
                .replacen("127.0.0.1/", &through, 1);
        if !routed.contains(&through) {
            return Err(format!("not a URL on {upstream}: {url}"));
        }
        Ok(match (url.starts_with("mysql://"), routed.contains('?')) {
            (true, true) => format!("{routed}&prefer_socket=false"),
            (true, false) => format!("{routed}?prefer_socket=false"),
            (false, _) => routed,
        })
    }

    pub fn set(&self, mode: Mode) {
        self.shared.mode.store(mode as u8, Ordering::SeqCst);
    }

    /// New connections go to `upstream` (those open stay where they are).
    pub fn switch(&self, upstream: SocketAddr) {
        *self.shared.upstream.lock().expect("the upstream") = upstream;
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
        self.set(Mode::Refuse);
        // Wakes the accept loop so that it sees the stop.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// One client connection, as the mode was when it came.
fn serve(client: TcpStream, shared: &Arc<Shared>) {
    let upstream = *shared.upstream.lock().expect("the upstream");
    match shared.mode() {
        Mode::Refuse => drop(client),
        Mode::Blackhole => swallow(client, shared),
        Mode::Forward => {
            let Ok(server) = TcpStream::connect(upstream) else {
                return;
            };
            let (Ok(client_in), Ok(server_in)) = (client.try_clone(), server.try_clone()) else {
                return;
            };
            let up = shared.clone();
            std::thread::spawn(move || pump(client_in, server, &up));
            pump(server_in, client, shared);
        }
    }
}

/// Copies `from` to `to` while the proxy forwards; on `Refuse` closes
/// both, on `Blackhole` keeps both open and forwards nothing more.
fn pump(mut from: TcpStream, mut to: TcpStream, shared: &Shared) {
    let _ = from.set_read_timeout(Some(Duration::from_millis(50)));
    let mut buffer = [0u8; 16 * 1024];
    loop {
        if shared.stopped.load(Ordering::SeqCst) {
            break;
        }
        match shared.mode() {
            Mode::Refuse => break,
            Mode::Blackhole => {
                // Read and drop: the peer sees a server that never answers.
                match from.read(&mut buffer) {
                    Ok(0) => break,
                    _ => continue,
                }
            }
            Mode::Forward => {}
        }
        match from.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => {
                if shared.mode() != Mode::Forward {
                    continue;
                }
                if to.write_all(&buffer[..n]).is_err() {
                    break;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

/// A connection accepted while blackholed: read and dropped until the
/// client goes or the proxy refuses.
fn swallow(mut client: TcpStream, shared: &Shared) {
    let _ = client.set_read_timeout(Some(Duration::from_millis(50)));
    let mut buffer = [0u8; 4096];
    while !shared.stopped.load(Ordering::SeqCst) && shared.mode() == Mode::Blackhole {
        if let Ok(0) = client.read(&mut buffer) {
            break;
        }
    }
}
