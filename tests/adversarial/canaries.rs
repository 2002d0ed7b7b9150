//! Host canaries: things the guest must never see or touch.

use std::io::Read;
use std::net::{Ipv6Addr, TcpListener, UdpSocket};
#[cfg(unix)]
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use pycage::RunResult;
use pycage_tools::ToolRegistry;
use serde_json::json;

/// The environment variable planted in the host process.
pub const ENV_NAME: &str = "PYCAGE_ADVERSARIAL_SECRET";
const ENV_VALUE: &str = "CANARY-ENV-7c1e5";
const FILE_VALUE: &str = "CANARY-FILE-93ab0";
const TOOL_VALUE: &str = "CANARY-TOOL-d44f2";

/// The environment canary's value.
pub fn env_value() -> &'static str {
    ENV_VALUE
}

/// Re-runs this binary with the environment canary set, unless it already is; returns the
/// child's exit code when it re-ran.
pub fn reexec_with_env_canary() -> Option<ExitCode> {
    if std::env::var_os(ENV_NAME).is_some() {
        return None;
    }
    let exe = std::env::current_exe().ok()?;
    let status = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env(ENV_NAME, ENV_VALUE)
        .status()
        .ok()?;
    Some(if status.success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

pub struct Canaries {
    dir: PathBuf,
    secret_calls: Arc<AtomicU32>,
    tcp: TcpListener,
    /// The same port on IPv6 loopback, where the host has it: a request to `[::1]` or to a
    /// name resolving there is caught too.
    tcp6: Option<TcpListener>,
    udp: UdpSocket,
    #[cfg(unix)]
    unix: UnixListener,
}

impl Canaries {
    pub fn plant() -> Canaries {
        let dir = std::env::temp_dir().join(format!("pycage-adversarial-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a temp dir");
        std::fs::write(dir.join("secret.txt"), FILE_VALUE).expect("the file canary");
        let tcp = TcpListener::bind("127.0.0.1:0").expect("a tcp listener");
        tcp.set_nonblocking(true).unwrap();
        let port = tcp.local_addr().unwrap().port();
        let tcp6 = TcpListener::bind((Ipv6Addr::LOCALHOST, port)).ok();
        if let Some(listener) = &tcp6 {
            listener.set_nonblocking(true).unwrap();
        } else {
            eprintln!("adversarial: no IPv6 loopback listener here; [::1] goes unwatched");
        }
        let udp = UdpSocket::bind("127.0.0.1:0").expect("a udp socket");
        udp.set_nonblocking(true).unwrap();
        #[cfg(unix)]
        let unix = UnixListener::bind(dir.join("host.sock")).expect("a unix listener");
        #[cfg(unix)]
        unix.set_nonblocking(true).unwrap();
        Canaries {
            dir,
            secret_calls: Arc::new(AtomicU32::new(0)),
            tcp,
            tcp6,
            udp,
            #[cfg(unix)]
            unix,
        }
    }

    /// `vault.secret`: registered on the host, never exposed by any case's policy.
    pub fn secret_tools(&self) -> ToolRegistry {
        let mut r = ToolRegistry::new();
        let calls = self.secret_calls.clone();
        r.register_fn(
            "vault",
            "secret",
            "the host's secret",
            json!({"type": "object"}),
            move |_| {
                let calls = calls.clone();
                async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    Ok(json!({"secret": TOOL_VALUE}))
                }
            },
        )
        .expect("the secret tool registers");
        r
    }

    fn marker(&self) -> PathBuf {
        self.dir.join("pwned")
    }

    /// Fills the corpus placeholders with this run's canary locations.
    pub fn substitute(&self, code: &str) -> String {
        code.replace(
            "@CANARY_FILE@",
            &self.dir.join("secret.txt").display().to_string(),
        )
        .replace("@CANARY_DIR@", &self.dir.display().to_string())
        .replace("@MARKER@", &self.marker().display().to_string())
        .replace(
            "@TCP_PORT@",
            &self.tcp.local_addr().unwrap().port().to_string(),
        )
        .replace(
            "@UDP_PORT@",
            &self.udp.local_addr().unwrap().port().to_string(),
        )
        .replace(
            "@UNIX_SOCKET@",
            &self.dir.join("host.sock").display().to_string(),
        )
        .replace("@ENV_NAME@", ENV_NAME)
    }

    /// Fails when a canary value appears in `text` (`what` names where it was found).
    pub fn check_text(text: &str, what: &str) -> Result<(), String> {
        for canary in [ENV_VALUE, FILE_VALUE, TOOL_VALUE] {
            if text.contains(canary) {
                return Err(format!("canary {canary} reached {what}"));
            }
        }
        Ok(())
    }

    /// The invariants every case shares.
    pub fn check(&self, r: &RunResult) -> Result<(), String> {
        let text = format!(
            "{}\n{}\n{}\n{}",
            r.stdout,
            r.stderr,
            r.value,
            serde_json::to_string(&r.error).unwrap_or_default()
        );
        Self::check_text(&text, "the result")?;
        let calls = self.secret_calls.load(Ordering::SeqCst);
        if calls != 0 {
            return Err(format!("the secret tool ran {calls} time(s)"));
        }
        if self.marker().exists() {
            let _ = std::fs::remove_file(self.marker());
            return Err("a marker file appeared on the host".into());
        }
        for tcp in std::iter::once(&self.tcp).chain(&self.tcp6) {
            if let Ok((mut s, from)) = tcp.accept() {
                let _ = s.read(&mut [0; 64]);
                return Err(format!(
                    "the TCP listener accepted a connection from {from}"
                ));
            }
        }
        if let Ok((n, from)) = self.udp.recv_from(&mut [0; 64]) {
            return Err(format!("the UDP socket received {n} bytes from {from:?}"));
        }
        #[cfg(unix)]
        if self.unix.accept().is_ok() {
            return Err("the Unix socket accepted a connection".into());
        }
        if std::fs::read_to_string(self.dir.join("secret.txt"))
            .ok()
            .as_deref()
            != Some(FILE_VALUE)
        {
            return Err("the file canary was changed".into());
        }
        Ok(())
    }

    pub fn clean_up(&self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
