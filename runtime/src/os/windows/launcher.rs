//! One run on Windows: the AppContainer profile, the run directory and its ACLs, the broker's
//! pipe, the Job Object, the process, its output, the deadline and the classification.
//! Windows only; compile-checked, never run in CI (see the backend's docs).
//!
//! The child's ends of its stdio pipes are inheritable between their creation and the
//! process's (the handle list keeps every other handle from the guest): a process another
//! thread of the host starts in that moment with handle inheritance on could inherit them
//! too. That would hold the guest's output open, not reach the guest, and the output is
//! drained for [`DRAIN_GRACE`] only.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::windows::io::OwnedHandle;
use std::path::Path;
use std::ptr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use windows_sys::Win32::Foundation::ERROR_ALREADY_EXISTS;
use windows_sys::Win32::Security::Isolation::{
    CreateAppContainerProfile, DeleteAppContainerProfile, DeriveAppContainerSidFromAppContainerName,
};
use windows_sys::Win32::Security::{FreeSid, PSID};

use super::super::classify::{self, Reporter};
use super::super::guest_files;
use super::super::native::{backend_failure, files_refused, fuel_refused, guest_stdin, run_tag};
use super::super::token::random_hex;
use super::command_line::{command_line, environment_block};
use super::job::{self, JobEnd, JobEvents, JobPlan, JobReport};
use super::job_object::JobObject;
use super::pipe::PipeServer;
use super::process::{self, Launch};
use super::win32::{self, SidBuf, check_hresult, wide};
use super::{
    DEFAULT_SYSTEM_ROOT, ENV_SYSTEM_ROOT, NAME, acl, is_valid_app_container_name, render_settings,
};
use crate::RunResult;
use crate::backend::Job;
use crate::broker::ToolGate;
use crate::capture::CapturePipe;

/// How long output is still drained, and job messages awaited, after the job is gone.
const DRAIN_GRACE: Duration = Duration::from_millis(500);

/// The exit code the host gives the processes it terminates (the wall clock, and whatever
/// the guest's first process left). The host knows why it terminated them; the code is only
/// what other observers see.
const TERMINATED_BY_HOST: u32 = 0xC000_0001;

/// `HRESULT_FROM_WIN32(ERROR_ALREADY_EXISTS)`.
const HRESULT_ALREADY_EXISTS: i32 = (0x8007_0000_u32 | ERROR_ALREADY_EXISTS) as i32;

/// A SID Windows allocated for us, freed with `FreeSid`.
struct AllocatedSid(PSID);

impl Drop for AllocatedSid {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: the SID was allocated by the AppContainer call that returned it, for the
            // caller to free with FreeSid; this is its only owner.
            unsafe { FreeSid(self.0) };
        }
    }
}

/// A run's AppContainer profile, deleted when dropped.
struct AppContainer {
    /// The profile's name, NUL-terminated.
    name: Vec<u16>,
    sid: SidBuf,
}

impl AppContainer {
    /// Creates the profile `name` with no capabilities (or, when it exists already, derives
    /// its SID).
    fn create(name: &str) -> io::Result<AppContainer> {
        if !is_valid_app_container_name(name) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not an AppContainer name",
            ));
        }
        let wide_name = wide(name)?;
        let description = wide("A pycage run; deleted when the run ends")?;
        let mut sid: PSID = ptr::null_mut();
        // SAFETY: the names are NUL-terminated and alive for the call; no capabilities (a
        // null array of length 0); `sid` is a valid out-pointer.
        let hr = unsafe {
            CreateAppContainerProfile(
                wide_name.as_ptr(),
                wide_name.as_ptr(),
                description.as_ptr(),
                ptr::null(),
                0,
                &mut sid,
            )
        };
        if hr == HRESULT_ALREADY_EXISTS {
            // SAFETY: the name is NUL-terminated; `sid` is a valid out-pointer.
            check_hresult(unsafe {
                DeriveAppContainerSidFromAppContainerName(wide_name.as_ptr(), &mut sid)
            })?;
        } else {
            check_hresult(hr)?;
        }
        let allocated = AllocatedSid(sid);
        // SAFETY: the call succeeded, so `sid` is a valid SID, alive until `allocated` drops.
        let copied = unsafe { SidBuf::copy_from(allocated.0) };
        drop(allocated);
        let checked = copied.and_then(|sid| {
            if sid.sid().is_app_container() {
                Ok(sid)
            } else {
                Err(io::Error::other(
                    "the profile's SID is not an AppContainer's",
                ))
            }
        });
        match checked {
            Ok(sid) => Ok(AppContainer {
                name: wide_name,
                sid,
            }),
            Err(e) => {
                delete_profile(&wide_name);
                Err(e)
            }
        }
    }
}

/// Deletes the AppContainer profile `name` (NUL-terminated).
fn delete_profile(name: &[u16]) {
    // SAFETY: the name is NUL-terminated (every caller passes one made by `wide`).
    let hr = unsafe { DeleteAppContainerProfile(name.as_ptr()) };
    if hr < 0 {
        tracing::warn!(
            hresult = hr,
            "pycage: an AppContainer profile could not be deleted"
        );
    }
}

impl Drop for AppContainer {
    fn drop(&mut self) {
        delete_profile(&self.name);
    }
}

/// Whether an AppContainer profile can be created here: creates one and deletes it.
pub(super) fn probe() -> Result<(), String> {
    let name = format!("pycage.probe.{}", random_hex(8).map_err(|e| e.to_string())?);
    AppContainer::create(&name)
        .map(drop)
        .map_err(|e| e.to_string())
}

/// Copies a stream into a capture pipe until it ends, on a thread of its own (anonymous
/// pipes have no asynchronous reads); the receiver hears when it is done.
fn pump(mut stream: File, pipe: CapturePipe) -> io::Result<oneshot::Receiver<()>> {
    let (done, finished) = oneshot::channel();
    std::thread::Builder::new()
        .name("pycage-guest-output".into())
        .spawn(move || {
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => pipe.push(&buf[..n]),
                }
            }
            let _ = done.send(());
        })?;
    Ok(finished)
}

/// Writes the guest's input and closes its stdin, on a thread of its own.
fn feed(mut stdin: File, input: Vec<u8>) -> io::Result<()> {
    std::thread::Builder::new()
        .name("pycage-guest-input".into())
        .spawn(move || {
            // A guest that exits early closes its end: not an error of ours.
            let _ = stdin.write_all(&input);
        })?;
    Ok(())
}

/// Waits for the guest's first process until `deadline`; past it, terminates the job.
async fn wait(process: OwnedHandle, job: &JobObject, deadline: Instant) -> io::Result<JobEnd> {
    let process = Arc::new(process);
    let waiting = {
        let process = process.clone();
        tokio::task::spawn_blocking(move || process::wait(&process))
    };
    match tokio::time::timeout_at(deadline.into(), waiting).await {
        Ok(Ok(Ok(()))) => Ok(JobEnd::Exited(process::exit_code(&process)?)),
        Ok(Ok(Err(e))) => Err(e),
        Ok(Err(e)) => Err(io::Error::other(e)),
        Err(_) => {
            // The waiting thread returns once the process is gone; closing the job at the
            // end kills it if this fails.
            if let Err(e) = job.terminate(TERMINATED_BY_HOST) {
                tracing::error!(error = %e, "pycage: the guest's job could not be terminated");
            }
            Ok(JobEnd::TimedOut)
        }
    }
}

/// The job's messages, until its last process has exited (or [`DRAIN_GRACE`] has passed).
async fn drain(job: &JobObject) -> JobEvents {
    let mut events = JobEvents::default();
    let until = Instant::now() + DRAIN_GRACE;
    while !events.all_exited {
        match job.next_message() {
            Some(message) => events.note(message),
            None if Instant::now() >= until => {
                tracing::warn!("pycage: the guest's job did not report its end");
                break;
            }
            None => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    }
    events
}

/// The guest's run directory: a fresh private directory under `%TEMP%` (ambient
/// authority), removed when dropped.
fn run_dir() -> io::Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix("pycage-")
        .rand_bytes(12)
        .tempdir()
}

/// Runs a job's native guest in an AppContainer inside a Job Object, its calls going to
/// `gate`. `tool_calls` in the result is 0: the gate's owner knows the count.
pub(super) async fn run(job: Job, gate: Arc<dyn ToolGate>, interpreter: &Path) -> RunResult {
    let started = Instant::now();
    let fail = |error| RunResult::failed(NAME, error, started.elapsed());
    if job.limits.fuel().is_some() {
        return fail(fuel_refused(NAME));
    }
    if !job.files.is_empty() {
        return fail(files_refused(NAME));
    }
    let limits = job.limits.clone();
    let tag = match run_tag() {
        Ok(tag) => tag,
        Err(e) => return fail(e),
    };
    let Some(interpreter_text) = interpreter.to_str() else {
        return fail(backend_failure(
            "the interpreter's path is not text",
            interpreter.display(),
        ));
    };
    let dir = match run_dir() {
        Ok(dir) => dir,
        Err(e) => return fail(backend_failure("the run directory could not be created", e)),
    };
    let Some(dir_text) = dir.path().to_str().map(str::to_owned) else {
        return fail(backend_failure(
            "the run directory's path is not text",
            dir.path().display(),
        ));
    };
    let system_root = std::env::var(ENV_SYSTEM_ROOT)
        .ok()
        .filter(|root| Path::new(root).is_absolute())
        .unwrap_or_else(|| DEFAULT_SYSTEM_ROOT.to_owned());
    let settings = render_settings(&limits, &tag, interpreter_text, &dir_text, &system_root);

    let profile = match AppContainer::create(&settings.app_container_name) {
        Ok(p) => p,
        Err(e) => {
            return fail(backend_failure(
                "the AppContainer profile could not be created",
                e,
            ));
        }
    };
    let owner = match win32::current_user() {
        Ok(owner) => owner,
        Err(e) => return fail(backend_failure("the host's user could not be read", e)),
    };
    let container = profile.sid.sid();
    if let Err(e) = prepare_dir(dir.path(), &settings.work_dir, owner.sid(), container) {
        return fail(backend_failure(
            "the run directory could not be prepared",
            e,
        ));
    }
    let server = match PipeServer::start(
        &settings.pipe_name,
        &acl::pipe_sddl(owner.sid(), container),
        gate,
        &limits,
    ) {
        Ok(server) => server,
        Err(e) => return fail(backend_failure("the broker's pipe could not be opened", e)),
    };
    let stdin = guest_stdin(&settings.pipe_name, None, server.token(), &job);
    drop(job);
    let (program, args) = match settings.command_line.split_first() {
        Some(split) => split,
        None => return fail(backend_failure("the command line is empty", "")),
    };
    let rendered = command_line(program, args).and_then(|line| {
        environment_block(&settings.environment).map(|environment| (line, environment))
    });
    let (line, environment) = match rendered {
        Ok(r) => r,
        Err(e) => return fail(backend_failure("the guest's command could not be built", e)),
    };
    let job_object = match JobObject::create(&JobPlan::new(&settings.job)) {
        Ok(j) => j,
        Err(e) => return fail(backend_failure("the Job Object could not be created", e)),
    };
    let launch = Launch {
        application: interpreter,
        command_line: &line,
        environment: &environment,
        current_dir: Path::new(&settings.work_dir),
        container: &profile.sid,
    };
    let child = match process::spawn_suspended(&launch) {
        Ok(c) => c,
        Err(e) => return fail(backend_failure("the guest could not be started", e)),
    };
    let process::Child {
        process,
        thread,
        stdin: to_guest,
        stdout: guest_out,
        stderr: guest_err,
    } = child;
    if let Err(e) = job_object.assign(&process) {
        process::kill(&process);
        return fail(backend_failure("the guest could not be put in its job", e));
    }
    let stdout = CapturePipe::new(limits.max_output_bytes());
    let stderr = CapturePipe::new(limits.max_output_bytes());
    // The threads first, then the guest: a failure here leaves no guest running.
    let started_io = (|| {
        let pumps = [
            pump(guest_out, stdout.clone())?,
            pump(guest_err, stderr.clone())?,
        ];
        feed(to_guest, stdin)?;
        process::resume(&thread)?;
        Ok::<_, io::Error>(pumps)
    })();
    drop(thread);
    let pumps = match started_io {
        Ok(pumps) => pumps,
        Err(e) => {
            let _ = job_object.terminate(TERMINATED_BY_HOST);
            return fail(backend_failure("the guest could not be started", e));
        }
    };
    let end = wait(process, &job_object, started + limits.wall_timeout()).await;
    // Whatever the first process left is terminated with it.
    let _ = job_object.terminate(TERMINATED_BY_HOST);
    let events = drain(&job_object).await;
    let accounting = job_object.accounting();
    for pump in pumps {
        if tokio::time::timeout(DRAIN_GRACE, pump).await.is_err() {
            tracing::warn!("pycage: a guest's output stayed open after its job ended");
        }
    }
    let outcome = server.take_outcome();
    drop(server);
    drop(job_object);
    let end = match end {
        Ok(end) => end,
        Err(e) => return fail(backend_failure("waiting for the guest failed", e)),
    };
    let (user_time_100ns, terminated_by_limit) = match accounting {
        Ok(a) => a,
        Err(e) => return fail(backend_failure("the guest's job could not be read", e)),
    };
    let report = JobReport {
        end,
        events,
        terminated_by_limit,
        user_time_100ns,
        user_time_limit_100ns: settings.job.job_user_time_100ns,
    };
    let (exit, evidence) = job::exit_of(&report);
    let value = classify::classify(
        outcome,
        exit,
        evidence,
        Reporter::Guest,
        limits.max_value_bytes(),
    );
    if let Err(e) = dir.close() {
        tracing::warn!(error = %e, "pycage: could not remove a run directory");
    }
    drop(profile);
    RunResult::builder(NAME, value)
        .stdout(stdout.captured())
        .stderr(stderr.captured())
        .duration(started.elapsed())
        .build()
}

/// Grants the container its access to the run directory: reading it (and the guest's files,
/// written after the DACL so they inherit it), and modifying its working directory.
fn prepare_dir(
    dir: &Path,
    work_dir: &str,
    owner: &acl::Sid,
    container: &acl::Sid,
) -> io::Result<()> {
    win32::apply_sddl(dir, &acl::run_dir_sddl(owner, container))?;
    for (file, text) in guest_files::ALL {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(dir.join(file))?;
        f.write_all(text.as_bytes())?;
    }
    std::fs::create_dir(work_dir)?;
    win32::apply_sddl(Path::new(work_dir), &acl::work_dir_sddl(owner, container))
}
