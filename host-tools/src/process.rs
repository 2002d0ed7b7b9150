//! [`ProcessGroup`]: a child process that leads a process group of its own, so everything it
//! starts can be killed with it. The one spawner both command tools and pycage's OS backends
//! use.

use std::io;

use tokio::process::{Child, Command};

/// The host environment variables a command tool or an upstream MCP server inherits: what a
/// program needs to start and find its tools (`PATH`, `HOME`, the locale, the time zone, the
/// temporary directory, and Windows' system variables), and none of the rest, so a secret in
/// the host's environment (an API token, a cloud credential) reaches no child unless its
/// configuration names it (`pass_env`).
pub const INHERITED_ENV: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LANGUAGE",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "TMPDIR",
    // Windows: without these many programs do not start.
    "SYSTEMROOT",
    "SYSTEMDRIVE",
    "WINDIR",
    "COMSPEC",
    "PATHEXT",
    "TEMP",
    "TMP",
    "USERPROFILE",
    "APPDATA",
    "LOCALAPPDATA",
    "PROGRAMDATA",
    "PROGRAMFILES",
];

/// Clears `command`'s environment, then gives it [`INHERITED_ENV`] and the variables named in
/// `pass` from this process's environment (each that is set).
pub fn inherit_env_only(command: &mut Command, pass: &[String]) {
    command.env_clear();
    let names = INHERITED_ENV
        .iter()
        .copied()
        .chain(pass.iter().map(String::as_str));
    for name in names {
        if let Some(value) = std::env::var_os(name) {
            command.env(name, value);
        }
    }
}

/// A spawned child leading its own process group (on Unix; elsewhere, the child alone).
///
/// Dropping it kills the whole group and the child (`kill_on_drop`), so a cancelled call or
/// run leaves nothing running.
#[derive(Debug)]
pub struct ProcessGroup {
    child: Child,
    /// The group's id: the child's pid, read at spawn.
    #[cfg_attr(not(unix), allow(dead_code))]
    group: Option<i32>,
}

impl ProcessGroup {
    /// Spawns `command` as the leader of a new process group (Unix), killed on drop. The
    /// caller sets everything else: program, arguments, environment, pipes.
    ///
    /// # Errors
    ///
    /// When the command cannot be started.
    pub fn spawn(mut command: Command) -> io::Result<ProcessGroup> {
        command.kill_on_drop(true);
        #[cfg(unix)]
        command.process_group(0);
        let child = command.spawn()?;
        let group = child.id().and_then(|id| i32::try_from(id).ok());
        Ok(ProcessGroup { child, group })
    }

    /// The child, for its pipes and its exit status.
    pub fn child(&mut self) -> &mut Child {
        &mut self.child
    }

    /// Sends `SIGKILL` to every process in the group (no-op off Unix, and when the group is
    /// already gone).
    ///
    /// Also meant after the leader has been reaped: what it started may still run in the
    /// group, and POSIX does not reuse a group's id while any member is alive.
    pub fn kill_group(&self) {
        #[cfg(unix)]
        if let Some(group) = self.group.and_then(rustix::process::Pid::from_raw) {
            // ESRCH (everything already gone) is fine.
            let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        }
    }

    /// Kills the group and the child itself, and reaps the child.
    pub async fn kill(&mut self) {
        self.kill_group();
        if let Err(err) = self.child.kill().await {
            tracing::warn!(error = %err, "a child process could not be killed");
        }
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        // Only while the child is unreaped: afterwards a group with no members left could
        // share its id with a new one. (`kill_on_drop` then kills the child and tokio reaps
        // it.)
        if self.child.id().is_some() {
            self.kill_group();
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use std::process::Stdio;

    use super::*;

    #[tokio::test]
    async fn dropping_the_group_kills_what_the_child_started() {
        let mut command = Command::new("/bin/sh");
        command
            .args(["-c", "sleep 30 & echo $!; wait"])
            .stdout(Stdio::piped());
        let mut group = ProcessGroup::spawn(command).unwrap();
        let mut out = group.child().stdout.take().unwrap();
        let mut line = Vec::new();
        loop {
            let mut byte = [0u8];
            let n = tokio::io::AsyncReadExt::read(&mut out, &mut byte)
                .await
                .unwrap();
            if n == 0 || byte[0] == b'\n' {
                break;
            }
            line.push(byte[0]);
        }
        let grandchild: i32 = String::from_utf8(line).unwrap().trim().parse().unwrap();
        let alive = |pid: i32| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
        };
        assert!(alive(grandchild));
        drop(group);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while alive(grandchild) && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(!alive(grandchild), "the grandchild outlived its group");
    }
}
