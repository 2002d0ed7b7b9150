//! Control groups for a run's process tree: a cap on processes (`pids.max`) and memory
//! (`memory.max`) for the whole tree, and a way to kill all of it.
//!
//! rlimits are per process, and `RLIMIT_NPROC` is not enforced for the real root user, so a
//! fork bomb started by root escapes them; a cgroup does not. pycage uses one when the host
//! lets it write the cgroup file system:
//!
//! * **cgroup v2** (one unified hierarchy with the `pids` and `memory` controllers):
//!   `/sys/fs/cgroup/pycage/<run>`, with `pids.max`, `memory.max`, `memory.swap.max = 0`,
//!   killed through `cgroup.kill`;
//! * **cgroup v1** (the "hybrid" layout): `<pids mount>/<own cgroup>/pycage/<run>` and the same
//!   under the memory mount (`memory.limit_in_bytes`, and `memory.memsw.limit_in_bytes` where
//!   swap is accounted), nested under the host process's own cgroups so the host's limits
//!   still apply; killed through `cgroup.kill` of the unified hierarchy when there is one,
//!   else by signalling every member until none is left.
//!
//! A run's processes join before anything of theirs runs: the command is wrapped in a
//! `/bin/sh` that moves itself into the cgroups, then `exec`s the sandbox (see [`wrap`]).
//! The cgroups are removed after the run. Without a writable cgroup file system, runs fall
//! back to rlimits alone, and `availability()` says so.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

/// The shell that moves a run's first process into its cgroups; never looked up on `PATH`.
pub const SH: &str = "/bin/sh";

/// The directory under each hierarchy that holds pycage's run cgroups.
const BASE: &str = "pycage";

/// The exit status of the cgroup wrapper when it cannot join (a sandbox failure).
pub const JOIN_FAILED: i32 = 121;

/// How the host's cgroups can contain a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupSupport {
    /// cgroup v2: run cgroups live under `base` (`/sys/fs/cgroup/pycage`).
    V2 {
        /// The parent of every run cgroup.
        base: PathBuf,
    },
    /// cgroup v1 `pids` and `memory` controllers, plus a v2 hierarchy (without controllers)
    /// for `cgroup.kill`, when mounted.
    V1 {
        /// The parent of every run's pids cgroup.
        pids: PathBuf,
        /// The parent of every run's memory cgroup.
        memory: PathBuf,
        /// The parent of every run's unified cgroup (for `cgroup.kill`).
        unified: Option<PathBuf>,
    },
}

impl CgroupSupport {
    /// A one-line description for `availability()` and `pycage backends`.
    pub fn describe(&self) -> &'static str {
        match self {
            CgroupSupport::V2 { .. } => "cgroup v2 caps processes and memory of the whole tree",
            CgroupSupport::V1 { .. } => "cgroup v1 caps processes and memory of the whole tree",
        }
    }
}

/// What `/proc/self/mounts` says about cgroup hierarchies.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupMounts {
    /// Where cgroup v2 is mounted.
    pub unified: Option<PathBuf>,
    /// Where the v1 `pids` controller is mounted.
    pub pids: Option<PathBuf>,
    /// Where the v1 `memory` controller is mounted.
    pub memory: Option<PathBuf>,
}

/// Parses `/proc/self/mounts`.
pub fn parse_mounts(text: &str) -> CgroupMounts {
    let mut mounts = CgroupMounts::default();
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let (Some(_), Some(dir), Some(fstype), Some(options)) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let dir = PathBuf::from(unescape_mount_path(dir));
        match fstype {
            "cgroup2" if mounts.unified.is_none() => mounts.unified = Some(dir),
            "cgroup" => {
                for option in options.split(',') {
                    match option {
                        "pids" if mounts.pids.is_none() => mounts.pids = Some(dir.clone()),
                        "memory" if mounts.memory.is_none() => mounts.memory = Some(dir.clone()),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    mounts
}

/// `/proc/mounts` escapes spaces, tabs, newlines and backslashes as octal.
fn unescape_mount_path(text: &str) -> String {
    text.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// The process's own cgroup paths, from `/proc/self/cgroup`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnCgroups {
    /// In the unified (v2) hierarchy.
    pub unified: Option<String>,
    /// In the v1 `pids` hierarchy.
    pub pids: Option<String>,
    /// In the v1 `memory` hierarchy.
    pub memory: Option<String>,
}

/// Parses `/proc/self/cgroup` (`id:controllers:path` lines).
pub fn parse_own_cgroups(text: &str) -> OwnCgroups {
    let mut own = OwnCgroups::default();
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            own.unified = Some(path.to_owned());
        }
        for c in controllers.split(',') {
            match c {
                "pids" => own.pids = Some(path.to_owned()),
                "memory" => own.memory = Some(path.to_owned()),
                _ => {}
            }
        }
    }
    own
}

/// Where run cgroups go, from the mounts and the process's own cgroups; `None` when the
/// layout has no `pids` and `memory` controllers. Pure: `v2_controllers` is the content of
/// the unified root's `cgroup.controllers`.
pub fn plan(
    mounts: &CgroupMounts,
    own: &OwnCgroups,
    v2_controllers: Option<&str>,
) -> Option<CgroupSupport> {
    let has = |list: &str, c: &str| list.split_whitespace().any(|x| x == c);
    if let (Some(root), Some(list)) = (&mounts.unified, v2_controllers)
        && has(list, "pids")
        && has(list, "memory")
    {
        return Some(CgroupSupport::V2 {
            base: root.join(BASE),
        });
    }
    let nested = |mount: &Path, own: Option<&String>| {
        let rel = own.map_or("", |p| p.trim_start_matches('/'));
        mount.join(rel).join(BASE)
    };
    let (pids, memory) = (mounts.pids.as_ref()?, mounts.memory.as_ref()?);
    Some(CgroupSupport::V1 {
        pids: nested(pids, own.pids.as_ref()),
        memory: nested(memory, own.memory.as_ref()),
        unified: mounts
            .unified
            .as_ref()
            .map(|u| nested(u, own.unified.as_ref())),
    })
}

/// Probes the host once: which layout, and whether this process may create cgroups in it.
/// Uses ambient authority (`/proc`, `/sys/fs/cgroup`).
pub fn support() -> Result<&'static CgroupSupport, &'static str> {
    static SUPPORT: OnceLock<Result<CgroupSupport, &'static str>> = OnceLock::new();
    SUPPORT.get_or_init(probe).as_ref().map_err(|e| *e)
}

fn probe() -> Result<CgroupSupport, &'static str> {
    let mounts = std::fs::read_to_string("/proc/self/mounts")
        .map(|t| parse_mounts(&t))
        .map_err(|_| "/proc/self/mounts is unreadable")?;
    let own = std::fs::read_to_string("/proc/self/cgroup")
        .map(|t| parse_own_cgroups(&t))
        .unwrap_or_default();
    let controllers = mounts
        .unified
        .as_ref()
        .and_then(|u| std::fs::read_to_string(u.join("cgroup.controllers")).ok());
    let support = plan(&mounts, &own, controllers.as_deref())
        .ok_or("no cgroup hierarchy with pids and memory controllers")?;
    match &support {
        CgroupSupport::V2 { base } => {
            std::fs::create_dir_all(base).map_err(|_| "the cgroup file system is not writable")?;
            let root = base.parent().unwrap_or(base);
            // Delegate the controllers down to the run cgroups.
            for dir in [root, base.as_path()] {
                let enabled =
                    std::fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap_or_default();
                if !(enabled.contains("pids") && enabled.contains("memory")) {
                    std::fs::write(dir.join("cgroup.subtree_control"), "+pids +memory")
                        .map_err(|_| "the pids and memory controllers cannot be delegated")?;
                }
            }
        }
        CgroupSupport::V1 {
            pids,
            memory,
            unified,
        } => {
            for dir in [pids, memory] {
                std::fs::create_dir_all(dir)
                    .map_err(|_| "the cgroup file system is not writable")?;
            }
            if let Some(u) = unified {
                // Optional: only for `cgroup.kill`.
                let _ = std::fs::create_dir_all(u);
            }
        }
    }
    let bases: Vec<&Path> = match &support {
        CgroupSupport::V2 { base } => vec![base],
        CgroupSupport::V1 {
            pids,
            memory,
            unified,
        } => [Some(pids), Some(memory), unified.as_ref()]
            .into_iter()
            .flatten()
            .map(PathBuf::as_path)
            .collect(),
    };
    let alive = |pid: u32| Path::new(&format!("/proc/{pid}")).exists();
    for base in bases {
        sweep_orphans(base, alive, ORPHAN_MIN_AGE);
    }
    Ok(support)
}

/// How old an orphaned run cgroup must be before [`sweep_orphans`] removes it: a live run
/// joins its cgroup within milliseconds of making it.
const ORPHAN_MIN_AGE: Duration = Duration::from_secs(60);

/// The pid in a run cgroup's name, `run-<hex>-<pid>` (see `native::run_tag`).
fn owner_pid(name: &str) -> Option<u32> {
    let (_, pid) = name.strip_prefix("run-")?.rsplit_once('-')?;
    pid.parse().ok()
}

/// Removes the run cgroups under `base` that a pycage process which is gone left behind (it
/// was killed before it could remove them, so a later run's check for leftovers, or an
/// operator, would find them for ever): named for a pid that no longer runs, with no
/// members, and older than `min_age`. A cgroup with members is left alone: its owner may be
/// alive in another pid namespace. Returns how many it removed.
fn sweep_orphans(base: &Path, alive: impl Fn(u32) -> bool, min_age: Duration) -> usize {
    let own = std::process::id();
    let Ok(entries) = std::fs::read_dir(base) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(owner_pid) else {
            continue;
        };
        let dir = entry.path();
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|t| t.elapsed().is_ok_and(|age| age >= min_age));
        let members = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        if pid == own || !old || alive(pid) || !members.trim().is_empty() {
            continue;
        }
        if std::fs::remove_dir(&dir).is_ok() {
            tracing::info!(cgroup = %dir.display(), "pycage: removed a run cgroup its dead process left");
            removed += 1;
        }
    }
    removed
}

/// One run's cgroups. Killed and removed by [`RunCgroup::finish`] (or, as a fallback, on drop).
#[derive(Debug)]
pub struct RunCgroup {
    /// Every directory created, leaf first within each hierarchy.
    dirs: Vec<PathBuf>,
    /// The `cgroup.procs` files a run's first process writes itself into.
    procs: Vec<PathBuf>,
    /// A `cgroup.kill` file, where there is one.
    kill: Option<PathBuf>,
    /// The `cgroup.procs` whose members the fallback kill signals.
    members: PathBuf,
    /// Where the kernel counts out-of-memory kills.
    oom: OomCounter,
    finished: bool,
}

#[derive(Debug)]
enum OomCounter {
    /// `memory.events` (v2): `oom_kill N`.
    Events(PathBuf),
    /// `memory.oom_control` (v1): `oom_kill N`.
    Control(PathBuf),
}

impl RunCgroup {
    /// Creates the cgroups of one run named `name`, capping the tree at `max_processes` and
    /// `memory_bytes`.
    ///
    /// # Errors
    ///
    /// When a cgroup cannot be created or a limit cannot be written (whatever was created is
    /// removed again).
    pub fn create(
        support: &CgroupSupport,
        name: &str,
        max_processes: u64,
        memory_bytes: u64,
    ) -> std::io::Result<RunCgroup> {
        let mut cg = RunCgroup {
            dirs: Vec::new(),
            procs: Vec::new(),
            kill: None,
            members: PathBuf::new(),
            oom: OomCounter::Events(PathBuf::new()),
            finished: false,
        };
        let limits = |dir: &Path, files: &[(&str, String)]| -> std::io::Result<()> {
            for (file, value) in files {
                std::fs::write(dir.join(file), value)?;
            }
            Ok(())
        };
        match support {
            CgroupSupport::V2 { base } => {
                let dir = cg.make(base, name)?;
                limits(
                    &dir,
                    &[
                        ("pids.max", max_processes.to_string()),
                        ("memory.max", memory_bytes.to_string()),
                    ],
                )?;
                // Not every kernel has swap accounting; without swap there is nothing to cap.
                let _ = std::fs::write(dir.join("memory.swap.max"), "0");
                cg.kill = Some(dir.join("cgroup.kill"));
                cg.members = dir.join("cgroup.procs");
                cg.oom = OomCounter::Events(dir.join("memory.events"));
                cg.procs.push(dir.join("cgroup.procs"));
            }
            CgroupSupport::V1 {
                pids,
                memory,
                unified,
            } => {
                let p = cg.make(pids, name)?;
                limits(&p, &[("pids.max", max_processes.to_string())])?;
                let m = cg.make(memory, name)?;
                limits(&m, &[("memory.limit_in_bytes", memory_bytes.to_string())])?;
                if m.join("memory.memsw.limit_in_bytes").exists() {
                    limits(
                        &m,
                        &[("memory.memsw.limit_in_bytes", memory_bytes.to_string())],
                    )?;
                }
                cg.procs.push(p.join("cgroup.procs"));
                cg.procs.push(m.join("cgroup.procs"));
                cg.members = p.join("cgroup.procs");
                cg.oom = OomCounter::Control(m.join("memory.oom_control"));
                if let Some(u) = unified
                    && let Ok(dir) = cg.make(u, name)
                    && dir.join("cgroup.kill").exists()
                {
                    cg.procs.push(dir.join("cgroup.procs"));
                    cg.kill = Some(dir.join("cgroup.kill"));
                }
            }
        }
        Ok(cg)
    }

    fn make(&mut self, base: &Path, name: &str) -> std::io::Result<PathBuf> {
        let dir = base.join(name);
        std::fs::create_dir(&dir)?;
        self.dirs.push(dir.clone());
        Ok(dir)
    }

    /// The `cgroup.procs` files the run's first process joins.
    pub fn procs_files(&self) -> &[PathBuf] {
        &self.procs
    }

    /// True when the kernel killed a member for exceeding the memory cap.
    pub fn oom_killed(&self) -> bool {
        let (OomCounter::Events(path) | OomCounter::Control(path)) = &self.oom;
        std::fs::read_to_string(path)
            .map(|t| oom_kills(&t) > 0)
            .unwrap_or(false)
    }

    /// Kills every member, once.
    pub fn kill_all(&self) {
        if let Some(kill) = &self.kill
            && std::fs::write(kill, "1").is_ok()
        {
            return;
        }
        for pid in self.member_pids() {
            super::sys::kill_process(pid);
        }
    }

    fn member_pids(&self) -> Vec<i32> {
        std::fs::read_to_string(&self.members)
            .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    /// Kills every member until none is left, then removes the cgroups. Waits at most about
    /// two seconds; a cgroup that cannot be removed by then is logged and left.
    pub async fn finish(mut self) {
        self.finished = true;
        for _ in 0..200 {
            self.kill_all();
            if self.member_pids().is_empty() && self.remove_dirs() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tracing::warn!(cgroup = ?self.dirs, "pycage: a run's cgroup could not be removed");
    }

    /// As [`finish`](Self::finish), blocking the calling thread: for cleanup from a `Drop`
    /// (a session's), on a thread of its own.
    pub fn finish_blocking(mut self) {
        self.finished = true;
        for _ in 0..200 {
            self.kill_all();
            if self.member_pids().is_empty() && self.remove_dirs() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        tracing::warn!(cgroup = ?self.dirs, "pycage: a session's cgroup could not be removed");
    }

    /// As [`finish_blocking`](Self::finish_blocking), for at most `within`: `Some(self)`
    /// when members are still there by then.
    pub fn finish_within(mut self, within: Duration) -> Option<Self> {
        let until = std::time::Instant::now() + within;
        loop {
            self.kill_all();
            if self.member_pids().is_empty() && self.remove_dirs() {
                self.finished = true;
                return None;
            }
            if std::time::Instant::now() >= until {
                return Some(self);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Removes the directories that remain; true when all are gone.
    fn remove_dirs(&mut self) -> bool {
        self.dirs.retain(|d| match std::fs::remove_dir(d) {
            Ok(()) => false,
            Err(e) => e.kind() != std::io::ErrorKind::NotFound,
        });
        self.dirs.is_empty()
    }
}

impl Drop for RunCgroup {
    fn drop(&mut self) {
        if !self.finished {
            // A run that was cancelled: one best-effort pass.
            self.kill_all();
            self.remove_dirs();
        }
    }
}

/// The `oom_kill` count of `memory.events` or `memory.oom_control`.
pub fn oom_kills(text: &str) -> u64 {
    text.lines()
        .filter_map(|l| l.strip_prefix("oom_kill "))
        .filter_map(|n| n.trim().parse().ok())
        .next()
        .unwrap_or(0)
}

/// `command` started inside the cgroups whose `cgroup.procs` files are `procs`: a shell
/// writes its own pid into each (exiting with [`JOIN_FAILED`] if it cannot), then `exec`s the
/// command, so nothing of the command runs outside them.
pub fn wrap(procs: &[PathBuf], command: Vec<OsString>) -> Vec<OsString> {
    let mut argv: Vec<OsString> = vec![
        SH.into(),
        "-c".into(),
        format!(
            "while [ \"$1\" != -- ]; do echo 0 > \"$1\" || exit {JOIN_FAILED}; shift; done; shift; exec \"$@\""
        )
        .into(),
        "pycage-cgroup".into(),
    ];
    argv.extend(procs.iter().map(|p| p.as_os_str().to_owned()));
    argv.push("--".into());
    argv.extend(command);
    argv
}

#[cfg(test)]
#[path = "cgroup_tests.rs"]
mod tests;
