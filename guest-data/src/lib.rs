//! numpy and pandas for pycage's wasm guest, prebuilt.
//!
//! The guest is componentize-py 0.25.1's CPython 3.14 for `wasm32-wasip2`. A CPython extension
//! module must be built for exactly that interpreter and its libc, so PyPI's numpy and pandas
//! wheels do not fit it. [`WHEELS`] are wheels built for it by this crate's recipe
//! (`recipe/build`, from numpy's and pandas' sdists on PyPI with Debian's clang), tagged for
//! the guest's platform only ([`PLATFORM`]), and checked against their committed BLAKE3
//! digests when this crate is built. `pycage guest build` offers them to pip beside the package
//! index, so `--package numpy` and `--package pandas` resolve to them, and so does a package
//! that depends on them.

/// A prebuilt wheel.
#[derive(Debug, Clone, Copy)]
pub struct Wheel {
    /// The wheel's file name (`{name}-{version}-cp314-cp314-pycage_wasm32.whl`).
    pub file_name: &'static str,
    /// BLAKE3 of [`Wheel::bytes`], as committed in `wheels.blake3`.
    pub blake3: &'static str,
    /// The wheel.
    pub bytes: &'static [u8],
}

/// The wheels' platform tag. No other project's wheels carry it: another CPython for WASI
/// could not load these modules, nor could this guest load theirs.
pub const PLATFORM: &str = "pycage_wasm32";

/// The wheels' Python and ABI tag: CPython 3.14.
pub const ABI: &str = "cp314";

/// The prebuilt wheels, checked at build time.
pub static WHEELS: &[Wheel] = include!(concat!(env!("OUT_DIR"), "/wheels.rs"));

#[cfg(test)]
mod tests {
    use super::{ABI, PLATFORM, WHEELS};

    #[test]
    fn every_wheel_is_tagged_for_the_guest_and_is_a_zip() {
        assert!(!WHEELS.is_empty());
        for wheel in WHEELS {
            assert!(
                wheel
                    .file_name
                    .ends_with(&format!("-{ABI}-{ABI}-{PLATFORM}.whl")),
                "{}",
                wheel.file_name
            );
            assert_eq!(&wheel.bytes[..4], b"PK\x03\x04", "{}", wheel.file_name);
            assert_eq!(blake3::hash(wheel.bytes).to_hex().as_str(), wheel.blake3);
        }
    }
}
