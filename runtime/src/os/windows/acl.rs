//! Who may open what in a run, as SDDL text (the security descriptor language Windows
//! parses with `ConvertStringSecurityDescriptorToSecurityDescriptorW`): pure, and unit-tested
//! on every OS.
//!
//! Every descriptor here is protected (`P`: nothing is inherited from above) and grants
//! exactly two SIDs: the host's user (the owner, full access) and the run's AppContainer.
//! No group is named: not `Everyone` (`WD`), not `ALL APPLICATION PACKAGES` (`AC`), not
//! the administrators. An AppContainer process passes an access check only when both its
//! user and its package SID are granted the access, so the owner's entry is what lets the
//! guest's own user through, and the AppContainer's entry bounds what it gets.
//!
//! An AppContainer runs at low integrity, and an object without a label is at medium with
//! "no write up": whatever the guest must write to (the broker's pipe, its working
//! directory) carries a low mandatory label (`S:(ML;;NW;;;LW)`).

use std::fmt;

/// A SID in its string form (`S-1-5-21-…`), checked so that it cannot carry other SDDL.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Sid(String);

/// A string that is not a SID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidSid(pub String);

impl fmt::Display for InvalidSid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not a SID: {:?}", self.0)
    }
}

impl std::error::Error for InvalidSid {}

/// The prefix of every AppContainer's SID (`SECURITY_APP_PACKAGE_AUTHORITY`, then
/// `SECURITY_APP_PACKAGE_BASE_RID`).
pub const APP_CONTAINER_SID_PREFIX: &str = "S-1-15-2-";

impl Sid {
    /// Checks a SID's string form: `S-1-`, an authority and one to fifteen sub-authorities,
    /// all decimal.
    ///
    /// # Errors
    ///
    /// [`InvalidSid`] for anything else.
    pub fn parse(text: &str) -> Result<Sid, InvalidSid> {
        let invalid = || InvalidSid(text.to_owned());
        let rest = text.strip_prefix("S-1-").ok_or_else(invalid)?;
        let parts: Vec<&str> = rest.split('-').collect();
        // The authority is 48 bits (15 digits); a sub-authority 32 bits (10 digits).
        let well_formed = (2..=16).contains(&parts.len())
            && parts.iter().enumerate().all(|(i, p)| {
                let most = if i == 0 { 15 } else { 10 };
                !p.is_empty() && p.len() <= most && p.bytes().all(|b| b.is_ascii_digit())
            });
        if well_formed {
            Ok(Sid(text.to_owned()))
        } else {
            Err(invalid())
        }
    }

    /// The SID's string form.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// True for an AppContainer's SID ([`APP_CONTAINER_SID_PREFIX`]).
    pub fn is_app_container(&self) -> bool {
        self.0.starts_with(APP_CONTAINER_SID_PREFIX)
    }
}

impl fmt::Display for Sid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The low mandatory label with "no write up", for what the guest writes to.
const LOW_LABEL: &str = "S:(ML;;NW;;;LW)";

/// The low label, inherited by the files and directories created inside.
const LOW_LABEL_INHERITED: &str = "S:(ML;OICI;NW;;;LW)";

/// The broker's named pipe: the owner has full access (it creates every instance); the
/// AppContainer may read and write (`FRFW`). Python's `open(name, "r+b")` asks for
/// `GENERIC_READ | GENERIC_WRITE`, and a pipe's generic write includes creating instances;
/// the server caps them, and an instance the guest made could only answer the guest's own
/// connections (the host never connects as a client).
pub fn pipe_sddl(owner: &Sid, container: &Sid) -> String {
    format!("D:P(A;;FA;;;{owner})(A;;FRFW;;;{container}){LOW_LABEL}")
}

/// The run directory (the guest's Python files): the owner has full access, the
/// AppContainer may read and traverse (`FRFX`); both inherited by what is inside.
pub fn run_dir_sddl(owner: &Sid, container: &Sid) -> String {
    format!("D:P(A;OICI;FA;;;{owner})(A;OICI;FRFX;;;{container})")
}

/// The guest's working directory (its `TEMP`): the owner has full access, the AppContainer
/// may read, write, traverse and delete (`FRFWFXSD`, "modify": not change permissions or
/// owners), all inherited, with the low label so that it can write.
pub fn work_dir_sddl(owner: &Sid, container: &Sid) -> String {
    format!("D:P(A;OICI;FA;;;{owner})(A;OICI;FRFWFXSD;;;{container}){LOW_LABEL_INHERITED}")
}

#[cfg(test)]
#[path = "acl_tests.rs"]
mod tests;
