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
//! KiB more to copy back per reset, against 11 MiB released and faulted in. A slot whose gaps
//! take more than [`MAX_FILL_BYTES`], or that would then hold more than [`MAX_SLOT_BYTES`], or
//! while all slots together would hold more than [`MAX_TOTAL_BYTES`], is not filled, and keeps
//! wasmtime's behaviour.
//!
//! wasmtime gives an embedder no handle on a component's memory; its place is noted while
//! wasmtime lowers a run's code into it (`super::noted`).

// Only Linux resets slots in place (`PAGEMAP_SCAN`); elsewhere `merge` does nothing, and what
// it would use is left unused.
#![cfg_attr(not(target_os = "linux"), allow(dead_code))]

use std::sync::{Arc, OnceLock};

/// The most regions a slot is left holding: wasmtime follows 32, and a run may write a few
/// regions its slot has not held before.
const TARGET: usize = 28;

/// The most filled in one slot at one reset: past this, copying it back on every reset would
/// cost more than the faults it saves.
const MAX_FILL_BYTES: usize = 1 << 20;

/// A slot is filled only while the private pages it holds, the fill included, stay within this.
/// A private page stays one after its reset (it is copied back, not released), so once filled a
/// slot keeps what its runs write within 32 regions for good: its memory and its resets' copying
/// grow with it. A soak of 11,000 mixed runs, 16 at a time, with no bound grew the process's
/// private memory by 111 MiB (`tests/soak.rs`).
const MAX_SLOT_BYTES: usize = 2 << 20;

/// Slots are filled only while the private pages of every slot scanned, the fill included,
/// stay within this: many slots in use at once (concurrent runs, the reaper's backlog) keep
/// wasmtime's behaviour, which releases what lies past their 32nd region.
const MAX_TOTAL_BYTES: usize = 8 << 20;

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

impl super::noted::Noter for Arc<MemoryNote> {
    fn note(&self, memory: &mut [u8]) {
        MemoryNote::note(self, memory);
    }
}

/// The gaps to fill so that `regions` (sorted, disjoint `[start, end)` page ranges) become at
/// most [`TARGET`] regions, smallest first, if they come to at most `budget` pages; none if not.
fn gaps_to_fill(regions: &[(usize, usize)], budget: usize) -> Vec<(usize, usize)> {
    let mut gaps: Vec<(usize, usize)> = regions.windows(2).map(|w| (w[0].1, w[1].0)).collect();
    gaps.sort_by_key(|&(start, end)| (end - start, start));
    gaps.truncate(regions.len().saturating_sub(TARGET));
    let pages: usize = gaps.iter().map(|(start, end)| end - start).sum();
    if pages > budget {
        gaps.clear();
    }
    gaps
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
    use std::sync::{LazyLock, Mutex, PoisonError};

    static BOOK: LazyLock<Mutex<Book>> = LazyLock::new(Mutex::default);
    let page = rustix::param::page_size();
    let Some(span) = note.0.get() else {
        return;
    };
    let mut book = BOOK.lock().unwrap_or_else(PoisonError::into_inner);
    if !book.due(span.base) {
        return;
    }
    let Some(regions) = private_regions_of(span, page) else {
        return;
    };
    let private = regions.iter().map(|(start, end)| end - start).sum();
    let budget = book.allowance(span.base, private, page);
    let fill = gaps_to_fill(&regions, budget);
    for &(start, end) in &fill {
        for p in start..end {
            let byte = (span.base + p * page) as *mut u8;
            // SAFETY: the page is inside the memory as noted (it lies between two pages of
            // it), which is still mapped and the same size or larger: the store that owns it
            // is alive and about to be dropped by the caller, which holds it, so nothing else
            // reads or writes it now. The byte is written back unchanged.
            unsafe { byte.write_volatile(byte.read_volatile()) };
        }
    }
    book.filled(span.base, fill.iter().map(|(start, end)| end - start).sum());
}

/// What the reaper knows of the slots it has scanned, told apart by their memory's address
/// (fixed for the pool's life). A slot that is never reset again (its engine was dropped)
/// keeps its count here until its address is a slot's again: that only makes fills rarer.
#[derive(Debug, Default)]
struct Book {
    slots: std::collections::HashMap<usize, Slot>,
    /// The private pages of every slot, as each was last scanned (and filled).
    private: usize,
}

#[derive(Debug, Default)]
struct Slot {
    /// Resets until the next scan.
    skips: u32,
    /// Its private pages, as last scanned (and filled).
    private: usize,
}

impl Book {
    /// Whether the slot at `base` is due a scan: at its first reset, and then once in
    /// [`SCAN_EVERY`].
    fn due(&mut self, base: usize) -> bool {
        let slot = self.slots.entry(base).or_default();
        if slot.skips == 0 {
            slot.skips = SCAN_EVERY - 1;
            true
        } else {
            slot.skips -= 1;
            false
        }
    }

    /// Notes that the slot at `base` holds `private` pages now; returns how many pages may be
    /// filled in it.
    fn allowance(&mut self, base: usize, private: usize, page: usize) -> usize {
        let slot = self.slots.entry(base).or_default();
        self.private = self.private - slot.private + private;
        slot.private = private;
        (MAX_FILL_BYTES / page)
            .min((MAX_SLOT_BYTES / page).saturating_sub(private))
            .min((MAX_TOTAL_BYTES / page).saturating_sub(self.private))
    }

    /// Notes that `pages` were filled in the slot at `base`.
    fn filled(&mut self, base: usize, pages: usize) {
        self.slots.entry(base).or_default().private += pages;
        self.private += pages;
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
        assert!(gaps_to_fill(&regions, usize::MAX).is_empty());
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
        assert_eq!(gaps_to_fill(&regions, 6), vec![gap(5), gap(9), gap(20)]);
        assert!(gaps_to_fill(&regions, 5).is_empty());
    }

    #[test]
    fn a_slot_is_scanned_at_its_first_reset_then_once_in_scan_every() {
        let mut book = Book::default();
        let due: Vec<bool> = (0..2 * SCAN_EVERY).map(|_| book.due(4096)).collect();
        assert!(due[0]);
        assert_eq!(due.iter().filter(|&&d| d).count(), 2);
    }

    #[test]
    fn fills_stay_within_the_slots_and_the_totals_bounds() {
        let page = 4096;
        let mut book = Book::default();
        // A small slot may take a whole fill.
        assert_eq!(book.allowance(1 << 30, 60, page), MAX_FILL_BYTES / page);
        book.filled(1 << 30, 85);
        // A slot near its bound, only what is left of it.
        let near = MAX_SLOT_BYTES / page - 10;
        assert_eq!(book.allowance(2 << 30, near, page), 10);
        // Rescanning a slot replaces its count, not adds to it.
        book.allowance(1 << 30, 145, page);
        assert_eq!(book.private, 145 + near);
        // Slots enough to reach the total leave nothing to fill anywhere.
        for i in 3..3 + MAX_TOTAL_BYTES / MAX_SLOT_BYTES {
            book.allowance(i << 30, MAX_SLOT_BYTES / page, page);
        }
        assert_eq!(book.allowance(1 << 30, 145, page), 0);
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
