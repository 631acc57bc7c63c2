//! `diesel-inbox console`: the addresses it refuses, a read-only console,
//! and one behind `--token` (HTTP Basic), whose action's log names the
//! user; each stopped by SIGTERM.

use crate::browser::free_port;
use crate::data::Names;
use crate::support;
use assert_cmd::cargo::CommandCargoExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

type Check = Result<(), String>;

/// `diesel-inbox --database-url url console args..`, its stderr piped.
fn spawn(url: &str, args: &[&str]) -> Result<Child, String> {
    Command::cargo_bin("diesel-inbox")
        .map_err(|e| e.to_string())?
        .env_remove("DATABASE_URL")
        .env_remove("RUST_LOG")
        .env_remove("DIESEL_INBOX_CONSOLE_TOKEN")
        .args(["--database-url", url, "console"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())
}

/// Waits until `port` answers.
fn listening(child: &mut Child, port: u16) -> Check {
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("the console exited: {status}"));
        }
        if Instant::now() > deadline {
            return Err("the console did not listen within 20 s".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// SIGTERM, then its exit (0, within 10 s) and its stderr.
fn stopped(mut child: Child) -> Result<String, String> {
    let pid = child.id().to_string();
    Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            let mut log = String::new();
            if let Some(mut stderr) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut stderr, &mut log);
            }
            return if status.success() {
                Ok(log)
            } else {
                Err(format!("the console exited with {status}: {log}"))
            };
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return Err("the console did not stop within 10 s of SIGTERM".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub async fn cli_console(url: &str, names: &Names) -> Check {
    for (args, said) in [
        (vec!["--listen", "0.0.0.0:0"], "not a loopback address"),
        (
            vec!["--listen", "0.0.0.0:0", "--allow-remote"],
            "--allow-remote needs --token",
        ),
    ] {
        let (code, _, err) = support::run_cli(
            support::cli(url)
                .env_remove("DIESEL_INBOX_CONSOLE_TOKEN")
                .arg("console")
                .args(&args),
        );
        if code != 2 || !err.contains(said) {
            return Err(format!("console {args:?}: exit {code}: {err}"));
        }
    }
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| e.to_string())?;
    // Read-only: the page, no action.
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut child = spawn(url, &["--listen", &listen, "--read-only"])?;
    listening(&mut child, port)?;
    let page = http
        .get(format!("http://{listen}/dead?destination={}", names.dead))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = page.status().as_u16();
    let body = page.text().await.unwrap_or_default();
    stopped(child)?;
    if status != 200 || !body.contains(&names.script_id) || body.contains("class=\"action\"") {
        return Err(format!(
            "--read-only: {status}, actions shown: {}",
            body.contains("class=\"action\"")
        ));
    }
    // A token: every request needs it; an action's log names the user.
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut child = spawn(url, &["--listen", &listen, "--token", "s3cret"])?;
    listening(&mut child, port)?;
    let dead = format!("http://{listen}/dead?destination={}", names.dead);
    let anonymous = http
        .get(&dead)
        .send()
        .await
        .map_err(|e| e.to_string())?
        .status()
        .as_u16();
    let wrong = http
        .get(&dead)
        .basic_auth("alice", Some("guess"))
        .send()
        .await
        .map_err(|e| e.to_string())?
        .status()
        .as_u16();
    let page = http
        .get(&dead)
        .basic_auth("alice", Some("s3cret"))
        .send()
        .await
        .map_err(|e| e.to_string())?
        .text()
        .await
        .map_err(|e| e.to_string())?;
    let token = page
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or("")
        .to_owned();
    let acted = http
        .post(format!("http://{listen}/actions/retry"))
        .basic_auth("alice", Some("s3cret"))
        .form(&[("csrf", token.as_str()), ("id", names.script_id.as_str())])
        .send()
        .await
        .map_err(|e| e.to_string())?
        .status()
        .as_u16();
    let log = stopped(child)?;
    if (anonymous, wrong, acted) != (401, 401, 303) {
        return Err(format!(
            "--token: no password {anonymous}, a wrong one {wrong}, the action {acted}"
        ));
    }
    if !log.contains("diesel-inbox console: action") || !log.contains("who=alice") {
        return Err(format!("the action's log does not name alice: {log}"));
    }
    Ok(())
}
