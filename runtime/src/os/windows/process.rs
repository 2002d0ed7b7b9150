//! Creating the guest's process: suspended, in an AppContainer with no capabilities,
//! inheriting only its three stdio pipes. Windows only; compile-checked, never run in CI
//! (see the backend's docs).

use std::fs::File;
use std::io;
use std::marker::PhantomData;
use std::os::windows::io::{AsRawHandle, FromRawHandle, OwnedHandle};
use std::path::Path;
use std::ptr;

use windows_sys::Win32::Foundation::WAIT_OBJECT_0;
use windows_sys::Win32::Foundation::{HANDLE, HANDLE_FLAG_INHERIT, SetHandleInformation};
use windows_sys::Win32::Security::SECURITY_CAPABILITIES;
use windows_sys::Win32::System::Pipes::CreatePipe;
use windows_sys::Win32::System::Threading::{
    CREATE_NO_WINDOW, CREATE_SUSPENDED, CREATE_UNICODE_ENVIRONMENT, CreateProcessW,
    DeleteProcThreadAttributeList, EXTENDED_STARTUPINFO_PRESENT, GetExitCodeProcess, INFINITE,
    InitializeProcThreadAttributeList, LPPROC_THREAD_ATTRIBUTE_LIST,
    PROC_THREAD_ATTRIBUTE_HANDLE_LIST, PROC_THREAD_ATTRIBUTE_SECURITY_CAPABILITIES,
    PROCESS_INFORMATION, ResumeThread, STARTF_USESTDHANDLES, STARTUPINFOEXW, TerminateProcess,
    UpdateProcThreadAttribute, WaitForSingleObject,
};

use super::win32::{SidBuf, check, wide};

/// What to start.
#[derive(Debug)]
pub(super) struct Launch<'a> {
    /// The program, an absolute path (`lpApplicationName`: no search).
    pub application: &'a Path,
    /// The whole command line, quoted ([`command_line`](super::command_line::command_line)).
    pub command_line: &'a str,
    /// The environment block ([`environment_block`](super::command_line::environment_block)).
    pub environment: &'a [u16],
    /// The current directory.
    pub current_dir: &'a Path,
    /// The AppContainer to run in.
    pub container: &'a SidBuf,
}

/// A created, still suspended process and the host's ends of its stdio.
#[derive(Debug)]
pub(super) struct Child {
    /// The process.
    pub process: OwnedHandle,
    /// Its first thread, suspended until [`resume`]d.
    pub thread: OwnedHandle,
    /// Its standard input.
    pub stdin: File,
    /// Its standard output.
    pub stdout: File,
    /// Its standard error.
    pub stderr: File,
}

/// Lets a suspended thread run.
///
/// # Errors
///
/// When the thread cannot be resumed.
pub(super) fn resume(thread: &OwnedHandle) -> io::Result<()> {
    // SAFETY: the thread handle is valid (THREAD_SUSPEND_RESUME: we created it).
    if unsafe { ResumeThread(thread.as_raw_handle()) } == u32::MAX {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Terminates a process (before it was put into a job, nothing else would).
pub(super) fn kill(process: &OwnedHandle) {
    // SAFETY: the process handle is valid (PROCESS_TERMINATE: we created it).
    if unsafe { TerminateProcess(process.as_raw_handle(), 1) } == 0 {
        tracing::error!(
            error = %io::Error::last_os_error(),
            "pycage: a guest process could not be terminated"
        );
    }
}

/// Waits until `process` has exited. Blocks.
///
/// # Errors
///
/// When the wait fails.
pub(super) fn wait(process: &OwnedHandle) -> io::Result<()> {
    // SAFETY: the handle is a valid process handle (SYNCHRONIZE), open for the whole wait.
    match unsafe { WaitForSingleObject(process.as_raw_handle(), INFINITE) } {
        WAIT_OBJECT_0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// The exit code of a process that has exited.
///
/// # Errors
///
/// When it cannot be read.
pub(super) fn exit_code(process: &OwnedHandle) -> io::Result<u32> {
    let mut code = 0u32;
    // SAFETY: the handle is a valid process handle; `code` is a valid out-pointer.
    check(unsafe { GetExitCodeProcess(process.as_raw_handle(), &mut code) })?;
    Ok(code)
}

/// An anonymous pipe's read and write ends, neither inheritable.
fn pipe() -> io::Result<(OwnedHandle, OwnedHandle)> {
    let (mut read, mut write): (HANDLE, HANDLE) = (ptr::null_mut(), ptr::null_mut());
    // SAFETY: valid out-pointers; null attributes (default security, not inheritable); the
    // default buffer size.
    check(unsafe { CreatePipe(&mut read, &mut write, ptr::null(), 0) })?;
    // SAFETY: on success both handles are new, valid and owned by nobody else.
    Ok(unsafe {
        (
            OwnedHandle::from_raw_handle(read),
            OwnedHandle::from_raw_handle(write),
        )
    })
}

/// Makes a handle inheritable (for the child's ends of its pipes, which the handle list then
/// names: only they are inherited).
fn inheritable(handle: &OwnedHandle) -> io::Result<()> {
    // SAFETY: the handle is valid and ours.
    check(unsafe {
        SetHandleInformation(
            handle.as_raw_handle(),
            HANDLE_FLAG_INHERIT,
            HANDLE_FLAG_INHERIT,
        )
    })
}

/// A process's attribute list. Windows keeps pointers to the values set, so they are
/// borrowed for as long as the list lives.
struct AttributeList<'a> {
    /// The list's memory, in `u64`s for its alignment.
    buffer: Vec<u64>,
    values: PhantomData<&'a ()>,
}

impl<'a> AttributeList<'a> {
    /// A list with room for `count` attributes.
    fn new(count: u32) -> io::Result<AttributeList<'a>> {
        let mut size = 0usize;
        // SAFETY: a size query: a null list and a valid out-pointer. It fails with
        // ERROR_INSUFFICIENT_BUFFER and sets `size`.
        unsafe { InitializeProcThreadAttributeList(ptr::null_mut(), count, 0, &mut size) };
        if size == 0 {
            return Err(io::Error::last_os_error());
        }
        let mut buffer = vec![0u64; size.div_ceil(8)];
        // SAFETY: `buffer` has room for `size` bytes, aligned for the list.
        check(unsafe {
            InitializeProcThreadAttributeList(buffer.as_mut_ptr().cast(), count, 0, &mut size)
        })?;
        Ok(AttributeList {
            buffer,
            values: PhantomData,
        })
    }

    fn as_ptr(&mut self) -> LPPROC_THREAD_ATTRIBUTE_LIST {
        self.buffer.as_mut_ptr().cast()
    }

    /// Sets `attribute` to `value`.
    ///
    /// # Safety
    ///
    /// `T` is the type `attribute` takes.
    unsafe fn set<T>(&mut self, attribute: u32, value: &'a T) -> io::Result<()> {
        let list = self.as_ptr();
        // SAFETY: the list is initialised and has room; `value` is the type `attribute` takes
        // (the caller's promise), of `size_of::<T>()` bytes, and is borrowed for as long as
        // the list lives, as Windows requires.
        check(unsafe {
            UpdateProcThreadAttribute(
                list,
                0,
                attribute as usize,
                ptr::from_ref(value).cast(),
                size_of::<T>(),
                ptr::null_mut(),
                ptr::null(),
            )
        })
    }
}

impl Drop for AttributeList<'_> {
    fn drop(&mut self) {
        let list = self.as_ptr();
        // SAFETY: the list was initialised by `new` and is deleted once.
        unsafe { DeleteProcThreadAttributeList(list) };
    }
}

/// Creates the process, suspended, in the AppContainer with no capabilities, with pipes for
/// its stdin, stdout and stderr as the only handles it inherits.
///
/// # Errors
///
/// When a pipe, the attribute list or the process cannot be created.
pub(super) fn spawn_suspended(launch: &Launch<'_>) -> io::Result<Child> {
    if !launch.environment.ends_with(&[0, 0]) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "an environment block ends with two NULs",
        ));
    }
    let application = wide(launch.application)?;
    let mut command_line = wide(launch.command_line)?;
    let current_dir = wide(launch.current_dir)?;
    let (stdin_child, stdin) = pipe()?;
    let (stdout, stdout_child) = pipe()?;
    let (stderr, stderr_child) = pipe()?;
    for end in [&stdin_child, &stdout_child, &stderr_child] {
        inheritable(end)?;
    }
    // The values the list points at, declared first so that they outlive it.
    let capabilities = SECURITY_CAPABILITIES {
        AppContainerSid: launch.container.as_psid(),
        Capabilities: ptr::null_mut(),
        CapabilityCount: 0,
        Reserved: 0,
    };
    let inherited: [HANDLE; 3] = [
        stdin_child.as_raw_handle(),
        stdout_child.as_raw_handle(),
        stderr_child.as_raw_handle(),
    ];
    let mut attributes = AttributeList::new(2)?;
    // SAFETY: PROC_THREAD_ATTRIBUTE_SECURITY_CAPABILITIES takes a SECURITY_CAPABILITIES; the
    // SID it names lives in `launch.container`, which outlives the process's creation.
    unsafe { attributes.set(PROC_THREAD_ATTRIBUTE_SECURITY_CAPABILITIES, &capabilities) }?;
    // SAFETY: PROC_THREAD_ATTRIBUTE_HANDLE_LIST takes an array of inheritable handles.
    unsafe { attributes.set(PROC_THREAD_ATTRIBUTE_HANDLE_LIST, &inherited) }?;
    let mut startup = STARTUPINFOEXW::default();
    startup.StartupInfo.cb =
        u32::try_from(size_of::<STARTUPINFOEXW>()).map_err(io::Error::other)?;
    startup.StartupInfo.dwFlags = STARTF_USESTDHANDLES;
    startup.StartupInfo.hStdInput = inherited[0];
    startup.StartupInfo.hStdOutput = inherited[1];
    startup.StartupInfo.hStdError = inherited[2];
    startup.lpAttributeList = attributes.as_ptr();
    let mut info = PROCESS_INFORMATION::default();
    // SAFETY: the application, current directory and command line are NUL-terminated and
    // alive for the call, and the command line is writable (CreateProcessW may write to it);
    // the environment block is UTF-16 ending in two NULs (checked above), as
    // CREATE_UNICODE_ENVIRONMENT says; `startup` is a STARTUPINFOEXW whose `cb` says so (as
    // EXTENDED_STARTUPINFO_PRESENT says), its attribute list initialised and its values
    // alive; `info` is a valid out-pointer. No process or thread attributes (null).
    check(unsafe {
        CreateProcessW(
            application.as_ptr(),
            command_line.as_mut_ptr(),
            ptr::null(),
            ptr::null(),
            1,
            CREATE_SUSPENDED
                | EXTENDED_STARTUPINFO_PRESENT
                | CREATE_UNICODE_ENVIRONMENT
                | CREATE_NO_WINDOW,
            launch.environment.as_ptr().cast(),
            current_dir.as_ptr(),
            &startup.StartupInfo,
            &mut info,
        )
    })?;
    // SAFETY: on success both handles are new, valid and owned by nobody else.
    let (process, thread) = unsafe {
        (
            OwnedHandle::from_raw_handle(info.hProcess),
            OwnedHandle::from_raw_handle(info.hThread),
        )
    };
    // The child's ends close here, with the list: the child holds its own copies.
    drop(attributes);
    drop((stdin_child, stdout_child, stderr_child));
    Ok(Child {
        process,
        thread,
        stdin: File::from(stdin),
        stdout: File::from(stdout),
        stderr: File::from(stderr),
    })
}
