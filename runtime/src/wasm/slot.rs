//! Keeping what a pooled slot's in-place reset copies back within what wasmtime follows.
//!
//! A slot reset in place ([`SlotReset::InPlace`](super::engine::SlotReset)) finds the pages of
//! its memory that are private copies (`PAGEMAP_SCAN`), copies the snapshot back over them
//! and leaves them mapped, so the next instance in the slot writes them without a fault.
//! wasmtime 48 follows at most 32 separate regions of such pages; at the 32nd it stops and
//! releases everything after it (`madvise(MADV_DONTNEED)`), the snapshot's read-only mappings
//! included, which the next run then faults in again. A page stays a private copy after its
//! reset, so the regions a slot holds are the union of what its runs wrote: a run of `pass`
//! writes 29 regions, and a slot that ran the warm pool's priming snippet and `pass` over and
//! over settled at 41 regions of 60 pages. Its reset then released the last 11 MiB of the
//! memory every time, and a fresh `pass` took 0.49-0.51 ms; with every region followed it took
//! 0.25-0.26 ms (a build of wasmtime with that limit raised, side by side, 2,000 runs each).
//!
//! So before a used store goes back to the pool, [`merge`] reads which pages of its memory
//! are private copies (`/proc/self/pagemap`) and, when they form more than [`TARGET`]
//! regions, writes each byte of the smallest gaps between them back to itself: those pages
//! become private copies too, their regions merge, and every later reset copies them back
//! with the rest. In that slot, the ten smallest gaps (1 to 15 pages) came to 51 pages: 204
//! KiB more to copy back per reset, against 11 MiB released and faulted in. Gaps are filled up
//! to [`MAX_FILL_PAGES`] in all; a slot that needs more keeps wasmtime's behaviour.
//!
//! wasmtime gives an embedder no handle on a component's memory; as in `super::interrupt`,
//! the memory's place is noted while wasmtime lowers a run's code into it ([`NotedCode`]).

use std::mem::MaybeUninit;
use std::sync::{Arc, OnceLock};

use wasmtime::component::__internal::{
    CanonicalAbiInfo, InstanceType, InterfaceType, LowerContext,
};
use wasmtime::component::{ComponentType, Lower};

/// The most regions a slot is left holding: wasmtime follows 32, and a run may write a few
/// regions its slot has not held before.
const TARGET: usize = 28;

/// The most pages filled in one slot: past this, copying them back on every reset would cost
/// more than the faults it saves.
const MAX_FILL_PAGES: usize = 256;

/// A slot's pages are read once in this many of its resets. Reading the page map over a
/// guest's 28 MiB took more of the reaper thread than wasmtime's own scan (9% against 7% of
/// all samples in `perf record` of fresh runs), and a slot's regions change little from one
/// run to the next once its gaps are filled.
const SCAN_EVERY: u32 = 8;

/// Where a guest's linear memory is, noted when the guest is first called.
#[derive(Debug, Default)]
pub(crate) struct MemoryNote(OnceLock<Span>);

/// A linear memory's address and the size it had when noted (memories never move or shrink:
/// `memory_may_move(false)` in `super::engine`).
#[derive(Debug, Clone, Copy)]
struct Span {
    base: usize,
    len: usize,
}

impl MemoryNote {
    fn note(&self, memory: &mut [u8]) {
        self.0.get_or_init(|| Span {
            base: memory.as_mut_ptr().addr(),
            len: memory.len(),
        });
    }
}

/// A run's code, lowered into the guest as a `string`, which notes where the guest's memory
/// is on the way (see the module's documentation).
pub(crate) struct NotedCode {
    pub text: String,
    pub note: Arc<MemoryNote>,
}

// SAFETY: `NotedCode` is lowered exactly as `str` is: the same flat representation and
// canonical ABI, checked against the same interface type.
unsafe impl ComponentType for NotedCode {
    type Lower = <str as ComponentType>::Lower;
    const ABI: CanonicalAbiInfo = <str as ComponentType>::ABI;

    fn typecheck(ty: &InterfaceType, types: &InstanceType<'_>) -> wasmtime::Result<()> {
        <str as ComponentType>::typecheck(ty, types)
    }
}

// SAFETY: as for `ComponentType`: every lowering is `str`'s, after the memory's place is noted.
unsafe impl Lower for NotedCode {
    fn linear_lower_to_flat<T>(
        &self,
        cx: &mut LowerContext<'_, T>,
        ty: InterfaceType,
        dst: &mut MaybeUninit<Self::Lower>,
    ) -> wasmtime::Result<()> {
        self.note.note(cx.as_slice_mut());
        self.text.as_str().linear_lower_to_flat(cx, ty, dst)
    }

    fn linear_lower_to_memory<T>(
        &self,
        cx: &mut LowerContext<'_, T>,
        ty: InterfaceType,
        offset: usize,
    ) -> wasmtime::Result<()> {
        self.note.note(cx.as_slice_mut());
        self.text.as_str().linear_lower_to_memory(cx, ty, offset)
    }
}

/// The gaps to fill so that `regions` (sorted, disjoint `[start, end)` page ranges) become at
/// most [`TARGET`] regions, smallest first, within [`MAX_FILL_PAGES`] pages in all.
fn gaps_to_fill(regions: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let mut gaps: Vec<(usize, usize)> = regions.windows(2).map(|w| (w[0].1, w[1].0)).collect();
    gaps.sort_by_key(|&(start, end)| (end - start, start));
    let excess = regions.len().saturating_sub(TARGET);
    let mut filled = 0;
    gaps.into_iter()
        .take(excess)
        .take_while(|&(start, end)| {
            filled += end - start;
            filled <= MAX_FILL_PAGES
        })
        .collect()
}

/// The regions of private pages in `entries`, one `/proc/self/pagemap` entry per page: present,
/// not a file's page, and mapped only here (so not the shared zero page), as wasmtime's scan
/// counts them.
fn private_regions(entries: &[u8]) -> Vec<(usize, usize)> {
    const PRESENT: u64 = 1 << 63;
    const FILE_OR_SHARED: u64 = 1 << 61;
    const EXCLUSIVE: u64 = 1 << 56;
    let mut regions: Vec<(usize, usize)> = Vec::new();
    for (page, entry) in entries.chunks_exact(8).enumerate() {
        let mut raw = [0u8; 8];
        raw.copy_from_slice(entry);
        let e = u64::from_ne_bytes(raw);
        if e & (PRESENT | FILE_OR_SHARED | EXCLUSIVE) != PRESENT | EXCLUSIVE {
            continue;
        }
        match regions.last_mut() {
            Some(last) if last.1 == page => last.1 = page + 1,
            _ => regions.push((page, page + 1)),
        }
    }
    regions
}

/// Fills the smallest gaps between the private pages of the memory `note` names, if they form
/// more than [`TARGET`] regions (see the module's documentation). Called with the store that
/// owns the memory about to be dropped, so nothing else reads or writes it.
#[cfg(target_os = "linux")]
pub(crate) fn merge(note: &MemoryNote) {
    let page = rustix::param::page_size();
    let Some(span) = note.0.get() else {
        return;
    };
    if !scan_due(span.base) {
        return;
    }
    let Some(regions) = private_regions_of(span, page) else {
        return;
    };
    for (start, end) in gaps_to_fill(&regions) {
        for p in start..end {
            let byte = (span.base + p * page) as *mut u8;
            // SAFETY: the page is inside the memory as noted (it lies between two pages of
            // it), which is still mapped and the same size or larger: the store that owns it
            // is alive and about to be dropped by the caller, which holds it, so nothing else
            // reads or writes it now. The byte is written back unchanged.
            unsafe { byte.write_volatile(byte.read_volatile()) };
        }
    }
}

/// Whether the slot at `base` is due a scan: at its first reset, and then once in
/// [`SCAN_EVERY`]. Slots are told apart by their memory's address, fixed for the pool's life.
#[cfg(target_os = "linux")]
fn scan_due(base: usize) -> bool {
    use std::collections::HashMap;
    use std::sync::{LazyLock, Mutex, PoisonError};

    static SKIPS: LazyLock<Mutex<HashMap<usize, u32>>> = LazyLock::new(Mutex::default);
    let mut skips = SKIPS.lock().unwrap_or_else(PoisonError::into_inner);
    let left = skips.entry(base).or_insert(0);
    if *left == 0 {
        *left = SCAN_EVERY - 1;
        true
    } else {
        *left -= 1;
        false
    }
}

/// The regions of private pages in `span`, in pages from its start, from `/proc/self/pagemap`.
#[cfg(target_os = "linux")]
fn private_regions_of(span: &Span, page: usize) -> Option<Vec<(usize, usize)>> {
    use std::os::unix::fs::FileExt;
    use std::sync::LazyLock;

    static PAGEMAP: LazyLock<Option<std::fs::File>> =
        LazyLock::new(|| std::fs::File::open("/proc/self/pagemap").ok());
    let pagemap = PAGEMAP.as_ref()?;
    if !span.base.is_multiple_of(page) {
        return None;
    }
    let mut entries = vec![0u8; span.len / page * 8];
    let at = u64::try_from(span.base / page * 8).ok()?;
    pagemap.read_exact_at(&mut entries, at).ok()?;
    Some(private_regions(&entries))
}

/// Other hosts reset slots by releasing them (no `PAGEMAP_SCAN`): nothing to merge.
#[cfg(not(target_os = "linux"))]
pub(crate) fn merge(_note: &MemoryNote) {}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(private: &[usize], pages: usize) -> Vec<u8> {
        let mut out = vec![0u8; pages * 8];
        for &p in private {
            let e: u64 = 1 << 63 | 1 << 56;
            out[p * 8..p * 8 + 8].copy_from_slice(&e.to_ne_bytes());
        }
        out
    }

    #[test]
    fn private_regions_are_present_exclusive_pages_not_file_pages() {
        let mut e = entries(&[1, 2, 3, 7], 10);
        // Page 5: a file's page (the snapshot, never written). Page 6: the zero page
        // (present, not exclusive).
        e[5 * 8..6 * 8].copy_from_slice(&(1u64 << 63 | 1 << 61 | 1 << 56).to_ne_bytes());
        e[6 * 8..7 * 8].copy_from_slice(&(1u64 << 63).to_ne_bytes());
        assert_eq!(private_regions(&e), vec![(1, 4), (7, 8)]);
    }

    #[test]
    fn few_regions_need_no_fill() {
        let regions: Vec<_> = (0..TARGET).map(|i| (i * 10, i * 10 + 1)).collect();
        assert!(gaps_to_fill(&regions).is_empty());
    }

    #[test]
    fn the_smallest_gaps_are_filled_until_the_target() {
        // TARGET + 3 regions; the gaps after regions 5, 9 and 20 are the smallest.
        let mut regions = Vec::new();
        let mut at = 0;
        for i in 0..TARGET + 3 {
            regions.push((at, at + 1));
            at += 1 + if [5, 9, 20].contains(&i) { 2 } else { 50 };
        }
        let gap = |i: usize| (regions[i].1, regions[i + 1].0);
        assert_eq!(gaps_to_fill(&regions), vec![gap(5), gap(9), gap(20)]);
    }

    #[test]
    fn fill_stops_at_its_page_budget() {
        let regions: Vec<_> = (0..TARGET + 10)
            .map(|i| {
                (
                    i * (MAX_FILL_PAGES / 4 + 1),
                    i * (MAX_FILL_PAGES / 4 + 1) + 1,
                )
            })
            .collect();
        let fill = gaps_to_fill(&regions);
        let pages: usize = fill.iter().map(|(s, e)| e - s).sum();
        assert!(pages <= MAX_FILL_PAGES, "{pages}");
        assert_eq!(fill.len(), 4);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_slot_is_scanned_at_its_first_reset_then_once_in_scan_every() {
        // An address no slot has: memories are page-aligned.
        let due: Vec<bool> = (0..2 * SCAN_EVERY).map(|_| scan_due(1)).collect();
        assert!(due[0]);
        assert_eq!(due.iter().filter(|&&d| d).count(), 2);
    }

    /// A private mapping of a file stands for a slot's memory mapped from the snapshot: pages
    /// written in many separate places are merged by `merge` to within `TARGET` regions, by
    /// filling the smallest gaps, and its bytes stay the file's.
    #[cfg(target_os = "linux")]
    #[test]
    fn merge_fills_the_smallest_gaps_of_a_private_mapping_and_keeps_its_bytes() {
        use rustix::mm::{MapFlags, ProtFlags, mmap, munmap};
        use std::io::Write;

        let page = rustix::param::page_size();
        // TARGET + 6 written pages, with gaps of 1, 4, 7 and 10 pages in turn.
        let mut written = Vec::new();
        let mut at = 0;
        for i in 0..TARGET + 6 {
            written.push(at);
            at += 1 + 1 + (i % 4) * 3;
        }
        let pages = at;
        let content: Vec<u8> = (0..pages * page).map(|i| (i % 251) as u8).collect();
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&content).unwrap();
        // SAFETY: a new private mapping of a file of ours, unmapped at the end of the test.
        let base = unsafe {
            mmap(
                std::ptr::null_mut(),
                pages * page,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE,
                &file,
                0,
            )
        }
        .unwrap();
        // SAFETY: the mapping above, `pages * page` bytes, used only through this slice.
        let memory = unsafe { std::slice::from_raw_parts_mut(base.cast::<u8>(), pages * page) };
        for &p in &written {
            memory[p * page] = content[p * page];
        }
        let note = MemoryNote::default();
        note.note(memory);
        let span = *note.0.get().unwrap();
        assert_eq!(private_regions_of(&span, page).unwrap().len(), TARGET + 6);

        merge(&note);

        let regions = private_regions_of(&span, page).unwrap();
        assert_eq!(regions.len(), TARGET, "{regions:?}");
        // The six one-page gaps were the ones filled.
        let private: usize = regions.iter().map(|(s, e)| e - s).sum();
        assert_eq!(private, TARGET + 6 + 6);
        assert!(memory == &content[..], "the bytes changed");
        // SAFETY: the mapping made above, no longer used.
        unsafe { munmap(base, pages * page) }.unwrap();
    }
}
