//! The few owned wrappers over Win32 that the launcher and the pipe server share: wide
//! strings, handles, security descriptors made from SDDL, SIDs, and the user's own SID.
//! Windows only; compile-checked, never run in CI (see the backend's docs).

use std::ffi::{OsStr, c_void};
use std::io;
use std::os::windows::ffi::OsStrExt;
use std::os::windows::io::{FromRawHandle, OwnedHandle};
use std::path::Path;
use std::ptr;

use windows_sys::Win32::Foundation::{HANDLE, INVALID_HANDLE_VALUE, LocalFree};
use windows_sys::Win32::Security::Authorization::{
    ConvertSidToStringSidW, ConvertStringSecurityDescriptorToSecurityDescriptorW, SDDL_REVISION_1,
    SE_FILE_OBJECT, SetNamedSecurityInfoW,
};
use windows_sys::Win32::Security::{
    ACL, CopySid, DACL_SECURITY_INFORMATION, GetLengthSid, GetSecurityDescriptorDacl,
    GetSecurityDescriptorSacl, GetTokenInformation, IsValidSid, LABEL_SECURITY_INFORMATION,
    PROTECTED_DACL_SECURITY_INFORMATION, PSID, TOKEN_QUERY, TOKEN_USER, TokenUser,
};
use windows_sys::Win32::System::Threading::{GetCurrentProcess, OpenProcessToken};
use windows_sys::core::{BOOL, HRESULT};

use super::acl::Sid;

/// `s` as a NUL-terminated UTF-16 string.
///
/// # Errors
///
/// When `s` holds a NUL (the string would end there).
pub(super) fn wide(s: impl AsRef<OsStr>) -> io::Result<Vec<u16>> {
    let mut units: Vec<u16> = s.as_ref().encode_wide().collect();
    if units.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a NUL inside a string for Windows",
        ));
    }
    units.push(0);
    Ok(units)
}

/// The result of a call that returns a `BOOL` and sets the last error.
pub(super) fn check(ok: BOOL) -> io::Result<()> {
    if ok == 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// The result of a call that returns an `HRESULT`.
pub(super) fn check_hresult(hr: HRESULT) -> io::Result<()> {
    if hr < 0 {
        Err(io::Error::from_raw_os_error(hr))
    } else {
        Ok(())
    }
}

/// Owns a handle a call returned, or its error (a call that fails returns null or
/// `INVALID_HANDLE_VALUE` and sets the last error).
pub(super) fn owned(handle: HANDLE) -> io::Result<OwnedHandle> {
    if handle.is_null() || handle == INVALID_HANDLE_VALUE {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the handle is valid (checked above) and was just returned to us by the call
    // that opened it; nothing else owns it, so it is closed exactly once, by the OwnedHandle.
    Ok(unsafe { OwnedHandle::from_raw_handle(handle) })
}

/// Memory Windows allocated with `LocalAlloc` for us, freed with `LocalFree` when dropped.
struct LocalMemory(*mut c_void);

impl Drop for LocalMemory {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: the pointer came from a call documented to allocate it with LocalAlloc
            // for the caller to free, and this is its only owner.
            unsafe { LocalFree(self.0) };
        }
    }
}

/// A NUL-terminated UTF-16 string at `p`, read into a `String`.
///
/// # Safety
///
/// `p` points at a NUL-terminated UTF-16 string that stays valid during the call.
unsafe fn read_wide(p: *const u16) -> io::Result<String> {
    let mut len = 0;
    // SAFETY: the string is NUL-terminated (the caller's promise), so every unit read up to
    // and including the NUL is inside it.
    while unsafe { *p.add(len) } != 0 {
        len += 1;
    }
    // SAFETY: the `len` units before the NUL are initialised and valid (read just above).
    let units = unsafe { std::slice::from_raw_parts(p, len) };
    String::from_utf16(units).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// A self-relative security descriptor, parsed from SDDL and kept in memory of our own (so
/// that it is `Send`; a self-relative descriptor holds offsets, not pointers).
#[derive(Debug, Clone)]
pub(super) struct SecurityDescriptor {
    /// The descriptor's bytes, in `u32`s for its alignment.
    words: Vec<u32>,
}

impl SecurityDescriptor {
    /// Parses `sddl`.
    ///
    /// # Errors
    ///
    /// When Windows does not accept the text.
    pub(super) fn from_sddl(sddl: &str) -> io::Result<SecurityDescriptor> {
        let text = wide(sddl)?;
        let mut sd: *mut c_void = ptr::null_mut();
        let mut size = 0u32;
        // SAFETY: `text` is NUL-terminated and outlives the call; `sd` and `size` are valid
        // out-pointers. On success Windows allocates the descriptor with LocalAlloc.
        check(unsafe {
            ConvertStringSecurityDescriptorToSecurityDescriptorW(
                text.as_ptr(),
                SDDL_REVISION_1,
                &mut sd,
                &mut size,
            )
        })?;
        let local = LocalMemory(sd);
        let len = usize::try_from(size).map_err(io::Error::other)?;
        let mut words = vec![0u32; len.div_ceil(4)];
        // SAFETY: the call wrote a descriptor of `size` bytes at `sd`; `words` has room for
        // at least that many bytes, and the two do not overlap.
        unsafe { ptr::copy_nonoverlapping(local.0.cast::<u8>(), words.as_mut_ptr().cast(), len) };
        Ok(SecurityDescriptor { words })
    }

    /// The descriptor, for calls that read it (a `PSECURITY_DESCRIPTOR` is a mutable
    /// pointer in their signatures; none of the calls used here writes through it).
    pub(super) fn as_ptr(&self) -> *mut c_void {
        self.words.as_ptr().cast_mut().cast()
    }

    /// The descriptor's DACL and SACL (either may be absent: null).
    fn acls(&self) -> io::Result<(*mut ACL, *mut ACL)> {
        let (mut present, mut defaulted) = (0, 0);
        let mut dacl: *mut ACL = ptr::null_mut();
        // SAFETY: the descriptor is a valid self-relative one (made by Windows, copied
        // whole); the out-pointers are valid. The DACL returned points into `self.words`.
        check(unsafe {
            GetSecurityDescriptorDacl(self.as_ptr(), &mut present, &mut dacl, &mut defaulted)
        })?;
        if present == 0 {
            dacl = ptr::null_mut();
        }
        let mut sacl: *mut ACL = ptr::null_mut();
        // SAFETY: as above, for the SACL.
        check(unsafe {
            GetSecurityDescriptorSacl(self.as_ptr(), &mut present, &mut sacl, &mut defaulted)
        })?;
        if present == 0 {
            sacl = ptr::null_mut();
        }
        Ok((dacl, sacl))
    }
}

/// Replaces the DACL of the file or directory `path` with `sddl`'s, protected (nothing
/// inherited from the parent; what is inside inherits as the entries say), and its
/// mandatory label with `sddl`'s when it has one.
///
/// # Errors
///
/// When the text is not accepted or the object's security cannot be set.
pub(super) fn apply_sddl(path: &Path, sddl: &str) -> io::Result<()> {
    let sd = SecurityDescriptor::from_sddl(sddl)?;
    let (dacl, sacl) = sd.acls()?;
    let name = wide(path)?;
    // SAFETY: `name` is NUL-terminated; `dacl` points into `sd`, which outlives the call;
    // no owner, group or SACL is passed with DACL_SECURITY_INFORMATION.
    let status = unsafe {
        SetNamedSecurityInfoW(
            name.as_ptr(),
            SE_FILE_OBJECT,
            DACL_SECURITY_INFORMATION | PROTECTED_DACL_SECURITY_INFORMATION,
            ptr::null_mut(),
            ptr::null_mut(),
            dacl,
            ptr::null(),
        )
    };
    if status != 0 {
        return Err(io::Error::from_raw_os_error(status as i32));
    }
    if !sacl.is_null() {
        // SAFETY: as above; the SACL (the label) points into `sd`.
        let status = unsafe {
            SetNamedSecurityInfoW(
                name.as_ptr(),
                SE_FILE_OBJECT,
                LABEL_SECURITY_INFORMATION,
                ptr::null_mut(),
                ptr::null_mut(),
                ptr::null(),
                sacl,
            )
        };
        if status != 0 {
            return Err(io::Error::from_raw_os_error(status as i32));
        }
    }
    Ok(())
}

/// A SID in memory of our own (`Send`; a SID holds no pointers).
#[derive(Debug, Clone)]
pub(super) struct SidBuf {
    /// The SID's bytes, in `u32`s for its alignment.
    words: Vec<u32>,
    /// Its string form.
    text: Sid,
}

impl SidBuf {
    /// Copies the SID at `sid`.
    ///
    /// # Safety
    ///
    /// `sid` points at a SID that stays valid during the call.
    pub(super) unsafe fn copy_from(sid: PSID) -> io::Result<SidBuf> {
        // SAFETY: `sid` is a valid SID (the caller's promise).
        if unsafe { IsValidSid(sid) } == 0 {
            return Err(io::Error::other("not a valid SID"));
        }
        // SAFETY: as above.
        let len = unsafe { GetLengthSid(sid) };
        let mut words = vec![0u32; (len as usize).div_ceil(4)];
        // SAFETY: `words` has room for `len` bytes; the source is a valid SID of that length.
        check(unsafe { CopySid(len, words.as_mut_ptr().cast(), sid) })?;
        let mut text: *mut u16 = ptr::null_mut();
        // SAFETY: the SID is valid; `text` is a valid out-pointer, allocated by Windows with
        // LocalAlloc on success.
        check(unsafe { ConvertSidToStringSidW(sid, &mut text) })?;
        let local = LocalMemory(text.cast());
        // SAFETY: on success `text` is a NUL-terminated string, alive until `local` drops.
        let text = unsafe { read_wide(local.0.cast()) }?;
        let text = Sid::parse(&text).map_err(io::Error::other)?;
        Ok(SidBuf { words, text })
    }

    /// The SID, for calls that read it.
    pub(super) fn as_psid(&self) -> PSID {
        self.words.as_ptr().cast_mut().cast()
    }

    /// Its string form.
    pub(super) fn sid(&self) -> &Sid {
        &self.text
    }
}

/// The SID of the user this process runs as.
///
/// # Errors
///
/// When the process's token cannot be read.
pub(super) fn current_user() -> io::Result<SidBuf> {
    let mut token: HANDLE = ptr::null_mut();
    // SAFETY: GetCurrentProcess returns a pseudo-handle that needs no closing; `token` is a
    // valid out-pointer.
    check(unsafe { OpenProcessToken(GetCurrentProcess(), TOKEN_QUERY, &mut token) })?;
    let token = owned(token)?;
    let raw = std::os::windows::io::AsRawHandle::as_raw_handle(&token);
    let mut len = 0u32;
    // SAFETY: a size query: no buffer, `len` a valid out-pointer. It fails with
    // ERROR_INSUFFICIENT_BUFFER and sets `len`.
    unsafe { GetTokenInformation(raw, TokenUser, ptr::null_mut(), 0, &mut len) };
    if len == 0 {
        return Err(io::Error::last_os_error());
    }
    // In u64s, for TOKEN_USER's alignment.
    let mut buf = vec![0u64; (len as usize).div_ceil(8)];
    // SAFETY: `buf` has room for `len` bytes; `len` is a valid in/out pointer.
    check(unsafe { GetTokenInformation(raw, TokenUser, buf.as_mut_ptr().cast(), len, &mut len) })?;
    // SAFETY: on success the buffer holds a TOKEN_USER (aligned: the buffer is in u64s),
    // whose SID points inside the buffer, alive for the copy below.
    unsafe {
        let user = &*buf.as_ptr().cast::<TOKEN_USER>();
        SidBuf::copy_from(user.User.Sid)
    }
}
