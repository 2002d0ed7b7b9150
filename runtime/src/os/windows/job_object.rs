//! [`JobObject`]: a run's Job Object with its limits and completion port. Windows only;
//! compile-checked, never run in CI (see the backend's docs). What it is given and how its
//! end is read are plain data in [`job`](super::job).

use std::io;
use std::os::windows::io::{AsRawHandle, OwnedHandle};
use std::ptr;

use windows_sys::Win32::Foundation::INVALID_HANDLE_VALUE;
use windows_sys::Win32::System::IO::{
    CreateIoCompletionPort, GetQueuedCompletionStatus, OVERLAPPED,
};
use windows_sys::Win32::System::JobObjects::{
    AssignProcessToJobObject, CreateJobObjectW, JOB_OBJECT_LIMIT_ACTIVE_PROCESS,
    JOB_OBJECT_LIMIT_BREAKAWAY_OK, JOB_OBJECT_LIMIT_DIE_ON_UNHANDLED_EXCEPTION,
    JOB_OBJECT_LIMIT_JOB_MEMORY, JOB_OBJECT_LIMIT_JOB_TIME, JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE,
    JOB_OBJECT_LIMIT_PROCESS_MEMORY, JOB_OBJECT_LIMIT_SILENT_BREAKAWAY_OK,
    JOB_OBJECT_UILIMIT_DESKTOP, JOB_OBJECT_UILIMIT_DISPLAYSETTINGS, JOB_OBJECT_UILIMIT_EXITWINDOWS,
    JOB_OBJECT_UILIMIT_GLOBALATOMS, JOB_OBJECT_UILIMIT_HANDLES, JOB_OBJECT_UILIMIT_READCLIPBOARD,
    JOB_OBJECT_UILIMIT_SYSTEMPARAMETERS, JOB_OBJECT_UILIMIT_WRITECLIPBOARD,
    JOBOBJECT_ASSOCIATE_COMPLETION_PORT, JOBOBJECT_BASIC_ACCOUNTING_INFORMATION,
    JOBOBJECT_BASIC_UI_RESTRICTIONS, JOBOBJECT_EXTENDED_LIMIT_INFORMATION, JOBOBJECTINFOCLASS,
    JobObjectAssociateCompletionPortInformation, JobObjectBasicAccountingInformation,
    JobObjectBasicUIRestrictions, JobObjectExtendedLimitInformation, QueryInformationJobObject,
    SetInformationJobObject, TerminateJobObject,
};

use super::job::{self, JobPlan};
use super::win32::{check, owned};

// The plain data's values are winnt.h's: checked here, where windows-sys is at hand.
const _: () = {
    assert!(job::LIMIT_JOB_TIME == JOB_OBJECT_LIMIT_JOB_TIME);
    assert!(job::LIMIT_ACTIVE_PROCESS == JOB_OBJECT_LIMIT_ACTIVE_PROCESS);
    assert!(job::LIMIT_PROCESS_MEMORY == JOB_OBJECT_LIMIT_PROCESS_MEMORY);
    assert!(job::LIMIT_JOB_MEMORY == JOB_OBJECT_LIMIT_JOB_MEMORY);
    assert!(job::LIMIT_DIE_ON_UNHANDLED_EXCEPTION == JOB_OBJECT_LIMIT_DIE_ON_UNHANDLED_EXCEPTION);
    assert!(job::LIMIT_BREAKAWAY_OK == JOB_OBJECT_LIMIT_BREAKAWAY_OK);
    assert!(job::LIMIT_SILENT_BREAKAWAY_OK == JOB_OBJECT_LIMIT_SILENT_BREAKAWAY_OK);
    assert!(job::LIMIT_KILL_ON_JOB_CLOSE == JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE);
    // JOB_OBJECT_UILIMIT_ALL is the eight classic restrictions and the IME's (0x100, declared
    // outside the JobObjects module of windows-sys).
    assert!(
        job::UILIMIT_ALL
            == (JOB_OBJECT_UILIMIT_HANDLES
                | JOB_OBJECT_UILIMIT_READCLIPBOARD
                | JOB_OBJECT_UILIMIT_WRITECLIPBOARD
                | JOB_OBJECT_UILIMIT_SYSTEMPARAMETERS
                | JOB_OBJECT_UILIMIT_DISPLAYSETTINGS
                | JOB_OBJECT_UILIMIT_GLOBALATOMS
                | JOB_OBJECT_UILIMIT_DESKTOP
                | JOB_OBJECT_UILIMIT_EXITWINDOWS
                | 0x100)
    );
};

/// A Job Object with a run's limits, its completion port associated. Closing it (dropping)
/// kills every process still in it (`JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE`).
#[derive(Debug)]
pub(super) struct JobObject {
    job: OwnedHandle,
    port: OwnedHandle,
}

/// Sets one class of a job's information.
///
/// # Safety
///
/// `T` is the structure that `class` takes.
unsafe fn set_info<T>(job: &OwnedHandle, class: JOBOBJECTINFOCLASS, info: &T) -> io::Result<()> {
    let size = u32::try_from(size_of::<T>()).map_err(io::Error::other)?;
    // SAFETY: the job handle is valid; `info` is the structure `class` takes (the caller's
    // promise), readable for its whole size during the call.
    check(unsafe {
        SetInformationJobObject(job.as_raw_handle(), class, ptr::from_ref(info).cast(), size)
    })
}

impl JobObject {
    /// A new, unnamed job (not inheritable) with `plan`'s limits and UI restrictions, and a
    /// completion port for its messages.
    ///
    /// # Errors
    ///
    /// When the job or its port cannot be created or configured.
    pub(super) fn create(plan: &JobPlan) -> io::Result<JobObject> {
        // SAFETY: no security attributes (the default descriptor, not inheritable) and no
        // name: both may be null.
        let job = owned(unsafe { CreateJobObjectW(ptr::null(), ptr::null()) })?;
        let mut limits = JOBOBJECT_EXTENDED_LIMIT_INFORMATION::default();
        limits.BasicLimitInformation.LimitFlags = plan.limit_flags;
        limits.BasicLimitInformation.PerJobUserTimeLimit = plan.per_job_user_time_limit;
        limits.BasicLimitInformation.ActiveProcessLimit = plan.active_process_limit;
        limits.ProcessMemoryLimit =
            usize::try_from(plan.process_memory_limit).unwrap_or(usize::MAX);
        limits.JobMemoryLimit = usize::try_from(plan.job_memory_limit).unwrap_or(usize::MAX);
        // SAFETY: JobObjectExtendedLimitInformation takes a JOBOBJECT_EXTENDED_LIMIT_INFORMATION.
        unsafe { set_info(&job, JobObjectExtendedLimitInformation, &limits) }?;
        let ui = JOBOBJECT_BASIC_UI_RESTRICTIONS {
            UIRestrictionsClass: plan.ui_restrictions,
        };
        // SAFETY: JobObjectBasicUIRestrictions takes a JOBOBJECT_BASIC_UI_RESTRICTIONS.
        unsafe { set_info(&job, JobObjectBasicUIRestrictions, &ui) }?;
        // SAFETY: INVALID_HANDLE_VALUE and no existing port make a new port bound to no file.
        let port =
            owned(unsafe { CreateIoCompletionPort(INVALID_HANDLE_VALUE, ptr::null_mut(), 0, 1) })?;
        let association = JOBOBJECT_ASSOCIATE_COMPLETION_PORT {
            CompletionKey: ptr::null_mut(),
            CompletionPort: port.as_raw_handle(),
        };
        // SAFETY: JobObjectAssociateCompletionPortInformation takes a
        // JOBOBJECT_ASSOCIATE_COMPLETION_PORT; the port is valid and outlives the job.
        unsafe {
            set_info(
                &job,
                JobObjectAssociateCompletionPortInformation,
                &association,
            )
        }?;
        Ok(JobObject { job, port })
    }

    /// Puts a (suspended) process into the job.
    ///
    /// # Errors
    ///
    /// When Windows refuses.
    pub(super) fn assign(&self, process: &OwnedHandle) -> io::Result<()> {
        // SAFETY: both handles are valid and open.
        check(unsafe {
            AssignProcessToJobObject(self.job.as_raw_handle(), process.as_raw_handle())
        })
    }

    /// Terminates every process in the job with `exit_code`.
    ///
    /// # Errors
    ///
    /// When Windows refuses.
    pub(super) fn terminate(&self, exit_code: u32) -> io::Result<()> {
        // SAFETY: the job handle is valid and has JOB_OBJECT_TERMINATE (we created it).
        check(unsafe { TerminateJobObject(self.job.as_raw_handle(), exit_code) })
    }

    /// The next message of the job's completion port (`JOB_OBJECT_MSG_*`), if one is
    /// waiting. Never blocks.
    pub(super) fn next_message(&self) -> Option<u32> {
        let mut message = 0u32;
        let mut key = 0usize;
        let mut overlapped: *mut OVERLAPPED = ptr::null_mut();
        // SAFETY: the port is valid; the out-pointers are valid; a zero timeout returns at
        // once. For a job's port, `overlapped` receives a process id, never dereferenced.
        let ok = unsafe {
            GetQueuedCompletionStatus(
                self.port.as_raw_handle(),
                &mut message,
                &mut key,
                &mut overlapped,
                0,
            )
        };
        (ok != 0).then_some(message)
    }

    /// The job's accounting: its processes' user time (100 ns units) and how many
    /// processes the kernel terminated for a limit.
    ///
    /// # Errors
    ///
    /// When Windows refuses.
    pub(super) fn accounting(&self) -> io::Result<(u64, u32)> {
        let mut info = JOBOBJECT_BASIC_ACCOUNTING_INFORMATION::default();
        let size = u32::try_from(size_of_val(&info)).map_err(io::Error::other)?;
        // SAFETY: JobObjectBasicAccountingInformation fills a
        // JOBOBJECT_BASIC_ACCOUNTING_INFORMATION, writable for its whole size; the returned
        // length may be null.
        check(unsafe {
            QueryInformationJobObject(
                self.job.as_raw_handle(),
                JobObjectBasicAccountingInformation,
                ptr::from_mut(&mut info).cast(),
                size,
                ptr::null_mut(),
            )
        })?;
        Ok((
            u64::try_from(info.TotalUserTime).unwrap_or(0),
            info.TotalTerminatedProcesses,
        ))
    }
}
