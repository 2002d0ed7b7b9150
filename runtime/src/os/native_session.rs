//! A session of a native CPython guest: one sandboxed process (bubblewrap's) that serves run
//! after run, keeping the code's globals in `pycage_runner`.
//!
//! # Protocol
//!
//! The process starts as a one-shot run's does (the same sandbox command, with the session's
//! limits), but its stdin holds only a header saying `"session": true`. The guest then loops
//! over the run's socket: it asks for its next run (`next`), and the host answers when a run
//! starts, with a [`SessionJob`]: the code, the runner's request (`"session": true`), the
//! run's cap on call arguments, and a fresh random end-of-output marker. The guest runs the
//! code, writes the marker to its stdout and stderr, and sends the run's result frame. The
//! host
//!
//! * switches the socket's gate to the run's broker when the run starts and off when its
//!   result arrives (calls between runs are refused), so every run has its own call ceiling;
//! * keeps each run's stdout and stderr with the run's cap (see [`RunStream`]), never more,
//!   whatever the guest writes;
//! * enforces each run's wall deadline as a notebook's interrupt: past it, the guest's
//!   interpreter (the peer that asks for runs, by its socket credentials) gets `SIGINT`, so
//!   the code raises `KeyboardInterrupt`, the run ends as a timeout and the session lives.
//!   Code that has not stopped within `INTERRUPT_GRACE` (it swallowed the interrupt, or is
//!   stuck in C), and a guest whose process is unknown, get the whole tree (process group,
//!   cgroup, pid namespace) killed, and the run ends the session, as a guest that dies
//!   (memory cap, crash, `os._exit`) does;
//! * ends the session at the next run when a run was cancelled (its future dropped): the
//!   tree is killed as soon as the run's future is dropped, and the next run says so.
//!
//! Dropping the session kills the tree and removes its run directory and cgroup.
//!
//! # Security
//!
//! The isolation is a one-shot run's (see [`bubblewrap`](super::bubblewrap)); what changes is
//! that one process lives across runs. Its memory, processes and scratch space are the
//! session's (for bubblewrap its working directory too: one kernel-capped tmpfs for the
//! session's life, held by the host through a descriptor, see [`workdir`](super::workdir);
//! each run's inputs are written into it and its produced files read back between runs); CPU time is each run's wall clock (enforced by the host) with a per-process
//! backstop of [`SESSION_CPU_SECONDS`](super::rlimits::SESSION_CPU_SECONDS). Threads or
//! processes the code leaves running go on between runs, inside the same sandbox and limits,
//! until the session ends.

#[cfg(unix)]
pub(crate) use unix::open;

/// Off Unix: a native session needs the Unix socket transport.
#[cfg(not(unix))]
pub(crate) async fn open(
    sandbox: &dyn super::native::NativeSandbox,
    _limits: crate::Limits,
) -> Result<Box<dyn crate::backend::BackendSession>, crate::RunError> {
    Err(crate::RunError::new(
        crate::ErrorKind::BackendError,
        format!(
            "the `{}` backend cannot keep sessions here: its broker transport needs a Unix host",
            sandbox.name()
        ),
    ))
}

#[cfg(unix)]
mod unix {
    use std::process::Stdio;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use pycage_tools::process::ProcessGroup;
    use tokio::io::AsyncWriteExt;
    use tokio::process::Command;
    use tokio::sync::mpsc;
    use tokio::task::JoinHandle;

    use super::super::cgroup::{self, RunCgroup};
    use super::super::classify::{self, Evidence, Exit, Reporter};
    use super::super::guest_files;
    use super::super::native::{
        NativeRun, NativeSandbox, SOCKET_NAME, backend_failure, files_refused, fuel_refused,
        run_cgroup, run_tag, session_request_json, session_stdin,
    };
    use super::super::protocol::{self, SessionJob};
    use super::super::run_dir::RunDir;
    use super::super::run_stream::RunStream;
    use super::super::server::SocketServer;
    use super::super::token::random_hex;
    use super::super::workdir::{self, WORKDIR_SOCKET, WorkdirListener};
    use crate::backend::{BackendSession, Job, RunFuture};
    use crate::broker::{CallError, GateFuture, ToolGate};
    use crate::capture::Captured;
    use crate::files::{self, Scratch};
    use crate::{ErrorKind, Limits, RunError, RunResult};

    /// How long a new session's guest may take to start and ask for its first run.
    const STARTUP_TIMEOUT: Duration = Duration::from_secs(10);

    /// How long a run's output may still arrive after its result (the guest writes the
    /// markers before it sends the result, so an honest guest's are there already).
    const OUTPUT_GRACE: Duration = Duration::from_millis(500);

    /// How long the host waits for a killed tree's leader to be reaped.
    const REAP_TIMEOUT: Duration = Duration::from_secs(5);

    /// Starts a session's guest in `sandbox` with the session's `limits`, and waits until it
    /// asks for its first run.
    ///
    /// # Errors
    ///
    /// `backend_error` when the sandbox cannot run here, cannot be started, or its guest
    /// exits or stays silent before its first run.
    pub(crate) async fn open<S: NativeSandbox>(
        sandbox: &S,
        limits: Limits,
    ) -> Result<Box<dyn BackendSession>, RunError> {
        let name = sandbox.name();
        sandbox
            .preflight()
            .map_err(|why| backend_failure("the sandbox cannot run here", why))?;
        let dir = RunDir::create()
            .map_err(|e| backend_failure("the session directory could not be created", e))?;
        for (file, text) in guest_files::ALL {
            dir.write_file(file, text.as_bytes())
                .map_err(|e| backend_failure("the guest's files could not be written", e))?;
        }
        let host_dir = dir.path().to_owned();
        let guest_socket = sandbox.guest_dir(&host_dir).join(SOCKET_NAME);
        let guest_socket = guest_socket.to_str().map(str::to_owned).ok_or_else(|| {
            backend_failure("the run directory's path is not text", host_dir.display())
        })?;
        let listener = if sandbox.takes_files() {
            Some(WorkdirListener::bind(&host_dir).map_err(|e| {
                backend_failure("the working directory's socket could not be opened", e)
            })?)
        } else {
            None
        };
        let gate = Arc::new(SwitchGate::default());
        let (server, jobs) = SocketServer::start_session(dir, gate.clone(), &limits)
            .map_err(|e| backend_failure("the broker's socket could not be opened", e))?;
        let tag = run_tag()?;
        let cgroup = if sandbox.uses_cgroup() {
            run_cgroup(&tag, limits.memory_bytes())?
        } else {
            None
        };
        let command = sandbox
            .command(&NativeRun {
                work_bytes: listener
                    .as_ref()
                    .map(|_| workdir::session_work_bytes(&limits)),
                limits: &limits,
                host_dir: &host_dir,
                tag: &tag,
                session: true,
            })
            .map_err(|e| backend_failure("the sandbox's command could not be built", e))?;
        let argv = match &cgroup {
            Some(cg) => cgroup::wrap(cg.procs_files(), command.argv),
            None => command.argv,
        };
        let (program, args) = argv
            .split_first()
            .ok_or_else(|| backend_failure("the sandbox's command is empty", ""))?;
        let mut spawn = Command::new(program);
        spawn
            .args(args)
            .env_clear()
            .envs(command.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&command.cwd)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut group = ProcessGroup::spawn(spawn)
            .map_err(|e| backend_failure("the sandbox could not be started", e))?;
        let child = group.child();
        let stdout = RunStream::default();
        let stderr = RunStream::default();
        let pumps = [
            child
                .stdout
                .take()
                .map(|s| tokio::spawn(stdout.clone().pump(s))),
            child
                .stderr
                .take()
                .map(|s| tokio::spawn(stderr.clone().pump(s))),
        ];
        let guest_workdir = listener.as_ref().map(|_| {
            sandbox
                .guest_dir(&host_dir)
                .join(WORKDIR_SOCKET)
                .to_string_lossy()
                .into_owned()
        });
        // The working directory arrives before the guest asks for its first run.
        let scratch = listener.map(|l| tokio::spawn(l.receive(Vec::new(), limits.clone())));
        let header = session_stdin(
            &guest_socket,
            guest_workdir.as_deref(),
            server.token(),
            &limits,
        );
        if let Some(mut stdin) = child.stdin.take() {
            // The header is one short line; the guest reads it first. A guest that exits
            // at once closes its end: the wait below says so.
            let _ = tokio::time::timeout(STARTUP_TIMEOUT, stdin.write_all(&header)).await;
        }
        let mut guest = Guest {
            group,
            cgroup,
            server,
            jobs,
            gate,
            stdout,
            stderr,
            pumps,
            scratch: None,
        };
        tokio::select! {
            biased;
            () = guest.server.asked() => {}
            status = guest.group.child().wait() => {
                tracing::error!(status = ?status, "pycage: a session's guest exited at its start");
                return Err(RunError::new(
                    ErrorKind::BackendError,
                    "the sandbox could not start the session's guest",
                ));
            }
            () = tokio::time::sleep(STARTUP_TIMEOUT) => {
                return Err(RunError::new(
                    ErrorKind::BackendError,
                    "the session's guest did not start in time",
                ));
            }
        }
        if let Some(task) = scratch {
            // The guest asked: its bootstrap had the host's acknowledgement already.
            if !task.is_finished() {
                task.abort();
            }
            let scratch = task
                .await
                .map_err(std::io::Error::other)
                .and_then(|r| r)
                .map_err(|e| {
                    backend_failure("the guest's working directory could not be set up", e)
                })?;
            guest.scratch = Some(scratch);
        }
        Ok(Box::new(NativeSession {
            name,
            guest: Some(guest),
            running: false,
        }))
    }

    /// The gate of the run in progress; between runs, calls are refused.
    #[derive(Default)]
    struct SwitchGate {
        current: Mutex<Option<Arc<dyn ToolGate>>>,
    }

    impl SwitchGate {
        fn set(&self, gate: Option<Arc<dyn ToolGate>>) {
            *self.current.lock().unwrap_or_else(|p| p.into_inner()) = gate;
        }

        fn current(&self) -> Option<Arc<dyn ToolGate>> {
            self.current
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
        }
    }

    impl ToolGate for SwitchGate {
        fn call<'a>(&'a self, name: &'a str, args_json: &'a str) -> GateFuture<'a> {
            let gate = self.current();
            Box::pin(async move {
                match gate {
                    Some(gate) => gate.call(name, args_json).await,
                    None => Err(CallError::Denied("no run is in progress".into())),
                }
            })
        }

        fn run_id(&self) -> &str {
            "session"
        }
    }

    /// A session's guest process and everything the host keeps for it.
    struct Guest {
        group: ProcessGroup,
        cgroup: Option<RunCgroup>,
        /// The socket (and the run directory, which goes with it).
        server: SocketServer,
        jobs: mpsc::Sender<String>,
        gate: Arc<SwitchGate>,
        stdout: RunStream,
        stderr: RunStream,
        pumps: [Option<JoinHandle<()>>; 2],
        /// The session's working directory (for a sandbox that takes files), held by its
        /// handle: its files persist from run to run.
        scratch: Option<Scratch>,
    }

    impl Drop for Guest {
        fn drop(&mut self) {
            // The group's leader is bubblewrap's outer process: killing it takes the pid
            // namespace (`--die-with-parent`), and the cgroup catches what is left.
            self.group.kill_group();
            if let Some(cg) = &self.cgroup {
                cg.kill_all();
            }
            let _ = self.group.child().start_kill();
            for pump in self.pumps.iter().flatten() {
                pump.abort();
            }
            // Removing the cgroup waits for its members to go. A killed tree is gone within
            // milliseconds, so the drop waits up to 100 ms itself: a blocking task queued at
            // the runtime's shutdown never starts (a test's runtime ends right after its
            // session), and that left an empty cgroup behind after a bubblewrap_sessions run.
            // A tree slower than that is left to a thread.
            if let Some(cg) = self.cgroup.take()
                && let Some(cg) = cg.finish_within(std::time::Duration::from_millis(100))
            {
                let cleanup = std::thread::Builder::new()
                    .name("pycage-session-cgroup".into())
                    .spawn(move || cg.finish_blocking());
                if let Err(e) = cleanup {
                    tracing::warn!(error = %e, "pycage: no thread to remove a session's cgroup");
                }
            }
        }
    }

    /// How a run in the guest ended, as the host saw it.
    enum Ended {
        Reported(protocol::Outcome),
        Exited(std::io::Result<std::process::ExitStatus>),
        TimedOut,
    }

    /// What interrupting a run at its deadline came to.
    enum Interrupted {
        /// The code stopped and the guest reported the run.
        Stopped(protocol::Outcome),
        /// The interrupt was sent, and no outcome came within the grace period.
        Ignored,
        /// There was no interpreter to interrupt (its process unknown or gone).
        NotSent,
    }

    /// What a run left: its value, its output, and whether the guest is gone.
    struct Finished {
        value: Result<serde_json::Value, RunError>,
        stdout: Captured,
        stderr: Captured,
        ended: bool,
    }

    impl Guest {
        async fn run(&mut self, job: Job, gate: Arc<dyn ToolGate>, started: Instant) -> Finished {
            let limits = &job.limits;
            let deadline = started + limits.wall_timeout();
            let gone = |error: RunError| Finished {
                value: Err(error),
                stdout: self.stdout.take(),
                stderr: self.stderr.take(),
                ended: true,
            };
            if let Ok(Some(status)) = self.group.child().try_wait() {
                tracing::debug!(?status, "pycage: a session's guest exited between runs");
                return gone(RunError::new(
                    ErrorKind::SessionEnded,
                    "the session's guest exited between runs",
                ));
            }
            let marker = match random_hex(16) {
                Ok(hex) => format!("\u{0}pycage-end-of-run:{hex}\u{0}"),
                Err(e) => return gone(backend_failure("no randomness for the run", e)),
            };
            let cap = limits.max_output_bytes();
            self.stdout.begin(cap, marker.as_bytes());
            self.stderr.begin(cap, marker.as_bytes());
            self.gate.set(Some(gate));
            self.server.begin_run(protocol::max_frame_bytes(limits));
            let request = SessionJob {
                code: job.code.clone(),
                request_json: session_request_json(&job),
                max_args_bytes: limits.max_tool_args_bytes(),
                marker,
            };
            let ended = tokio::select! {
                biased;
                outcome = async {
                    // The guest takes each run before it sends that run's result, so the
                    // one slot is free; a guest that never asks meets the deadline.
                    if self.jobs.send(request.encode()).await.is_err() {
                        return None;
                    }
                    Some(self.server.outcome().await)
                } => match outcome {
                    Some(outcome) => Ended::Reported(outcome),
                    None => Ended::Exited(Err(std::io::Error::other("the socket is closed"))),
                },
                status = self.group.child().wait() => Ended::Exited(status),
                () = tokio::time::sleep_until(deadline.into()) => Ended::TimedOut,
            };
            self.gate.set(None);
            let max_value = limits.max_value_bytes();
            match ended {
                Ended::Reported(outcome) => self.reported(outcome, max_value).await,
                Ended::TimedOut => {
                    let sent = match self.interrupt().await {
                        Interrupted::Stopped(outcome) => {
                            let mut finished = self.reported(outcome, max_value).await;
                            let guest = finished.value.err();
                            finished.value = Err(crate::backend::interrupted(guest));
                            return finished;
                        }
                        Interrupted::Ignored => true,
                        Interrupted::NotSent => false,
                    };
                    self.kill().await;
                    if sent {
                        return self
                            .finished_dead(Err(crate::backend::interrupt_ignored()))
                            .await;
                    }
                    let value = classify::classify(
                        None,
                        Exit::TimedOut,
                        Evidence::default(),
                        Reporter::Guest,
                        max_value,
                    );
                    self.finished_dead(value).await
                }
                Ended::Exited(status) => {
                    let evidence = Evidence {
                        oom_killed: self.cgroup.as_ref().is_some_and(RunCgroup::oom_killed),
                        ..Evidence::default()
                    };
                    self.kill().await;
                    let exit = match status {
                        Ok(status) => classify::exit_of(status, false),
                        Err(e) => {
                            tracing::error!(error = %e, "pycage: waiting for a session's guest failed");
                            Exit::Signal(9)
                        }
                    };
                    let value = match classify::classify(
                        None,
                        exit,
                        evidence,
                        Reporter::Guest,
                        max_value,
                    ) {
                        // No result: the interpreter is gone, whatever its status says.
                        Ok(_) => Err(RunError::new(
                            ErrorKind::GuestException,
                            "the guest's interpreter exited during the run",
                        )),
                        Err(e) => Err(e),
                    };
                    self.finished_dead(value).await
                }
            }
        }

        /// The result of a run whose guest reported `outcome` and lives on.
        async fn reported(&self, outcome: protocol::Outcome, max_value: u64) -> Finished {
            let (stdout, stderr) = tokio::join!(
                self.stdout.finish(OUTPUT_GRACE),
                self.stderr.finish(OUTPUT_GRACE)
            );
            let value = classify::classify(
                Some(outcome),
                Exit::Code(0),
                Evidence::default(),
                Reporter::Guest,
                max_value,
            );
            Finished {
                value,
                stdout,
                stderr,
                ended: false,
            }
        }

        /// Interrupts the guest's interpreter at the run's deadline, as Ctrl-C would
        /// (`KeyboardInterrupt` in the running code), and waits up to
        /// [`INTERRUPT_GRACE`](crate::backend::INTERRUPT_GRACE) for the run's outcome.
        async fn interrupt(&mut self) -> Interrupted {
            let Some(pid) = self.server.guest_pid() else {
                return Interrupted::NotSent;
            };
            if !super::super::sys::interrupt_process(pid) {
                return Interrupted::NotSent;
            }
            tokio::select! {
                biased;
                outcome = self.server.outcome() => Interrupted::Stopped(outcome),
                _ = self.group.child().wait() => Interrupted::Ignored,
                () = tokio::time::sleep(crate::backend::INTERRUPT_GRACE) => Interrupted::Ignored,
            }
        }

        /// The result of a run whose guest is gone: the output that reached the host.
        async fn finished_dead(&self, value: Result<serde_json::Value, RunError>) -> Finished {
            let (stdout, stderr) = tokio::join!(
                self.stdout.finish(OUTPUT_GRACE),
                self.stderr.finish(OUTPUT_GRACE)
            );
            Finished {
                value,
                stdout,
                stderr,
                ended: true,
            }
        }

        /// Kills the whole tree, reaps its leader and removes its cgroup.
        async fn kill(&mut self) {
            self.group.kill_group();
            if let Some(cg) = &self.cgroup {
                cg.kill_all();
            }
            let child = self.group.child();
            let _ = child.start_kill();
            if tokio::time::timeout(REAP_TIMEOUT, child.wait())
                .await
                .is_err()
            {
                tracing::error!("pycage: a session's guest could not be reaped");
            }
            if let Some(cg) = self.cgroup.take() {
                cg.finish().await;
            }
        }
    }

    /// Writes a run's input files into the session's directory, after the same checks as a
    /// one-shot run's; a directory too full for them is the request's error.
    fn add_inputs(scratch: &mut Scratch, job: &Job) -> Result<(), RunError> {
        files::check_inputs(&job.files, &job.limits)?;
        scratch.add_inputs(job.files.clone()).map_err(|e| {
            // What the directory holds is the guest's doing (full, or a name taken by a
            // directory): the request's error, not the sandbox's.
            tracing::debug!(error = %e, "pycage: a session's input files could not be written");
            RunError::new(
                ErrorKind::InvalidInput,
                "the input files could not be written into the session's working directory \
                 (it is full, or holds a directory at an input file's name)",
            )
        })
    }

    /// A session's guest, as the library's [`Session`](crate::Session) holds it.
    struct NativeSession {
        name: &'static str,
        /// The guest; a run holds it while it runs (so a run's future dropped mid-run drops
        /// the guest, killing its tree), and puts it back unless the run ended it.
        guest: Option<Guest>,
        /// Set while a run is in the guest: still set when a run starts, the last run's
        /// future was dropped mid-run.
        running: bool,
    }

    impl NativeSession {
        fn result(
            &self,
            value: Result<serde_json::Value, RunError>,
            started: Instant,
        ) -> RunResult {
            RunResult::builder(self.name, value)
                .duration(started.elapsed())
                .build()
        }
    }

    impl BackendSession for NativeSession {
        fn run(&mut self, job: Job, gate: Arc<dyn ToolGate>) -> RunFuture<'_> {
            Box::pin(async move {
                let started = Instant::now();
                if std::mem::take(&mut self.running) {
                    self.guest = None;
                    return crate::backend::cancelled_run_ended(self.name, started.elapsed());
                }
                if job.limits.fuel().is_some() {
                    return self.result(Err(fuel_refused(self.name)), started);
                }
                let Some(mut guest) = self.guest.take() else {
                    let error =
                        RunError::new(ErrorKind::SessionEnded, "the session's guest is gone");
                    return self.result(Err(error), started);
                };
                if !job.files.is_empty() {
                    let placed = match guest.scratch.as_mut() {
                        None => Err(files_refused(self.name)),
                        Some(scratch) => add_inputs(scratch, &job),
                    };
                    if let Err(e) = placed {
                        self.guest = Some(guest);
                        return self.result(Err(e), started);
                    }
                }
                self.running = true;
                let max_returned = job.limits.max_returned_bytes();
                let max_files = usize::try_from(job.limits.max_files()).unwrap_or(usize::MAX);
                let finished = guest.run(job, gate, started).await;
                self.running = false;
                let mut stderr = finished.stderr;
                // What this run created or changed; then the directory as it is now is the
                // session's state, for the next run.
                let produced = guest.scratch.as_mut().map_or_else(Vec::new, |scratch| {
                    let (produced, overflow) = scratch.produced_within(max_returned, max_files);
                    if overflow {
                        stderr.text.push_str(&workdir::overflow_notice(max_files));
                    }
                    scratch.rebase_within(max_files);
                    produced
                });
                if !finished.ended {
                    self.guest = Some(guest);
                }
                RunResult::builder(self.name, finished.value)
                    .stdout(finished.stdout)
                    .stderr(stderr)
                    .files(produced)
                    .session_ended(finished.ended)
                    .duration(started.elapsed())
                    .build()
            })
        }
    }
}
