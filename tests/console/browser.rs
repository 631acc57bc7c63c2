//! A real browser: Debian's Chromium, headless, driven through its
//! WebDriver (Debian's `chromium-driver`) with fantoccini; and the
//! console's servers over TCP.

use fantoccini::{Client, ClientBuilder, Locator};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `chromedriver` on a port of its own, killed when dropped.
pub struct Driver {
    child: Child,
    pub url: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where Debian installs the driver and the browser (`.ci/run` installs
/// both); `INBOX_TEST_CHROMEDRIVER` and `INBOX_TEST_CHROMIUM` name others.
fn driver_binary() -> Option<String> {
    let named = std::env::var("INBOX_TEST_CHROMEDRIVER").ok();
    named
        .into_iter()
        .chain(["/usr/bin/chromedriver".to_owned()])
        .find(|path| std::path::Path::new(path).exists())
}

fn browser_binary() -> String {
    std::env::var("INBOX_TEST_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".to_owned())
}

impl Driver {
    /// The driver, or `None` (and a SKIPPED line) where it is not installed.
    pub fn start() -> Option<Result<Driver, String>> {
        let Some(binary) = driver_binary() else {
            println!("SKIPPED: the console's browser test: no chromedriver (apt-get install chromium chromium-driver; bash .ci/run installs them)");
            return None;
        };
        let port = free_port();
        let child = Command::new(binary)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let child = match child {
            Ok(child) => child,
            Err(e) => return Some(Err(format!("chromedriver: {e}"))),
        };
        let driver = Driver {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                return Some(Err("chromedriver did not listen within 20 s".into()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(Ok(driver))
    }

    /// A headless Chromium session.
    pub async fn session(&self) -> Result<Client, String> {
        self.session_with(&[]).await
    }

    /// A headless Chromium session with `extra` command-line switches
    /// (`--host-resolver-rules=...`).
    pub async fn session_with(&self, extra: &[&str]) -> Result<Client, String> {
        let mut args = vec![
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--window-size=1400,1000",
        ];
        args.extend_from_slice(extra);
        let mut capabilities = serde_json::Map::new();
        capabilities.insert("browserName".into(), "chrome".into());
        capabilities.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({ "binary": browser_binary(), "args": args }),
        );
        ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(capabilities)
            .connect(&self.url)
            .await
            .map_err(|e| format!("a Chromium session: {e}"))
    }
}

/// A port nothing listens on (the kernel's choice).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Serves `app` on `address` (port 0: any) with the peers' addresses, in
/// a task; its address.
pub async fn serve(app: axum::Router, address: &str) -> Result<SocketAddr, String> {
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|e| format!("bind {address}: {e}"))?;
    let bound = listener.local_addr().map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await;
    });
    Ok(bound)
}

/// The text of the first element `css` selects (found again when the
/// live overview replaced it between the find and the read).
pub async fn text(client: &Client, css: &str) -> Result<String, String> {
    let mut tries = 0;
    loop {
        let element = client
            .find(Locator::Css(css))
            .await
            .map_err(|e| format!("no {css}: {e}"))?;
        match element.text().await {
            Ok(text) => return Ok(text.trim().to_owned()),
            Err(e) if tries < 5 && e.to_string().contains("stale element") => tries += 1,
            Err(e) => return Err(format!("{css}: {e}")),
        }
    }
}

/// How many elements `css` selects.
pub async fn count(client: &Client, css: &str) -> Result<usize, String> {
    client
        .find_all(Locator::Css(css))
        .await
        .map(|all| all.len())
        .map_err(|e| format!("{css}: {e}"))
}

/// Clicks the first element `css` selects.
pub async fn click(client: &Client, css: &str) -> Result<(), String> {
    client
        .find(Locator::Css(css))
        .await
        .map_err(|e| format!("no {css}: {e}"))?
        .click()
        .await
        .map_err(|e| format!("click {css}: {e}"))
}

/// Opens `url` and waits for its page.
pub async fn open(client: &Client, url: &str) -> Result<(), String> {
    client
        .goto(url)
        .await
        .map_err(|e| format!("open {url}: {e}"))
}

/// Writes a screenshot of the page to `target/console/<name>.png`.
pub async fn screenshot(client: &Client, name: &str) -> Result<(), String> {
    let png = client.screenshot().await.map_err(|e| e.to_string())?;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/console");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    std::fs::write(dir.join(format!("{name}.png")), png).map_err(|e| e.to_string())
}
