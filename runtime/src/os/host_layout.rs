//! [`HostLayout`]: how the host's system directories (where the interpreter and its
//! libraries live) are laid out, so a sandbox can bind exactly those, read-only.

use std::ffi::OsString;
use std::path::PathBuf;

/// The system directories a sandbox may expose (read-only) for the interpreter to run.
pub const SYSTEM_DIRS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32",
];

/// What one system directory is on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SystemEntry {
    /// A real directory: bound read-only.
    Dir,
    /// A symbolic link (on merged-`/usr` systems, `/lib -> usr/lib`): recreated as the same
    /// link inside the sandbox.
    Symlink(PathBuf),
    /// Absent: left out.
    Missing,
}

/// The host's system directories.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostLayout {
    /// Each of [`SYSTEM_DIRS`] and what it is.
    pub entries: Vec<(&'static str, SystemEntry)>,
}

impl HostLayout {
    /// Looks at the host (ambient authority: the process's view of `/`).
    pub fn probe() -> HostLayout {
        let entries = SYSTEM_DIRS
            .iter()
            .map(|&dir| {
                let entry = match std::fs::symlink_metadata(dir) {
                    Ok(m) if m.file_type().is_symlink() => std::fs::read_link(dir)
                        .map(SystemEntry::Symlink)
                        .unwrap_or(SystemEntry::Missing),
                    Ok(m) if m.is_dir() => SystemEntry::Dir,
                    _ => SystemEntry::Missing,
                };
                (dir, entry)
            })
            .collect();
        HostLayout { entries }
    }

    /// A merged-`/usr` layout (Debian 12, Fedora, Arch): `/usr` is real, `/bin`, `/sbin`,
    /// `/lib`, `/lib64` link into it. For tests and documentation.
    pub fn merged_usr() -> HostLayout {
        let link = |t: &str| SystemEntry::Symlink(t.into());
        HostLayout {
            entries: vec![
                ("/usr", SystemEntry::Dir),
                ("/bin", link("usr/bin")),
                ("/sbin", link("usr/sbin")),
                ("/lib", link("usr/lib")),
                ("/lib64", link("usr/lib64")),
                ("/lib32", SystemEntry::Missing),
                ("/libx32", SystemEntry::Missing),
            ],
        }
    }

    /// The real directories, to bind read-only.
    pub fn real_dirs(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.entries
            .iter()
            .filter(|(_, e)| *e == SystemEntry::Dir)
            .map(|(d, _)| *d)
    }

    /// The bubblewrap arguments that recreate this layout read-only.
    pub fn bwrap_args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = Vec::new();
        for (dir, entry) in &self.entries {
            match entry {
                SystemEntry::Dir => {
                    args.extend(["--ro-bind".into(), (*dir).into(), (*dir).into()]);
                }
                SystemEntry::Symlink(target) => {
                    args.extend([
                        "--symlink".into(),
                        target.as_os_str().to_owned(),
                        (*dir).into(),
                    ]);
                }
                SystemEntry::Missing => {}
            }
        }
        args
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_usr_binds_usr_and_links_the_rest() {
        let args: Vec<_> = HostLayout::merged_usr()
            .bwrap_args()
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect();
        assert_eq!(
            args.join(" "),
            "--ro-bind /usr /usr --symlink usr/bin /bin --symlink usr/sbin /sbin \
             --symlink usr/lib /lib --symlink usr/lib64 /lib64"
        );
        assert_eq!(
            HostLayout::merged_usr().real_dirs().collect::<Vec<_>>(),
            ["/usr"]
        );
    }

    #[test]
    fn split_layouts_bind_every_real_directory() {
        let layout = HostLayout {
            entries: vec![
                ("/usr", SystemEntry::Dir),
                ("/bin", SystemEntry::Dir),
                ("/lib", SystemEntry::Dir),
                ("/lib64", SystemEntry::Missing),
            ],
        };
        assert_eq!(
            layout.real_dirs().collect::<Vec<_>>(),
            ["/usr", "/bin", "/lib"]
        );
        assert_eq!(layout.bwrap_args().len(), 9);
    }

    #[test]
    fn the_probe_finds_usr() {
        let layout = HostLayout::probe();
        assert!(layout.real_dirs().any(|d| d == "/usr"));
    }
}
