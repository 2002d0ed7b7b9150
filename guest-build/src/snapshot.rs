//! The build's steps on the interpreter's heap snapshot and code: the parser's nesting limit
//! raised to the native one, and the snapshot's objects made immortal.

type Result<T> = std::result::Result<T, String>;

/// CPython's parser for WASI is built with `MAXSTACK` 4000 (6000 elsewhere): each parser rule
/// counts its depth against that constant, which stops at about 143 nested parentheses,
/// where native CPython accepts the tokenizer's limit of 200. Since Python 3.14 every rule also
/// checks the real C stack right after the counter (`p->level++ == MAXSTACK ||
/// _Py_ReachedRecursionLimitWithMargin(...)`), so the counter is not what keeps the stack
/// safe. This patch gives the WASI parser the native constant: in each rule's check, the
/// `i32.const 4000; i32.eq; br_if 0; call` sequence becomes `i32.const 6000` (both constants
/// are two-byte LEB128, so the binary keeps its layout). The guest's stack guard still ends
/// deeper nesting with a clean error.
pub(crate) fn raise_parser_depth(bytes: &mut [u8]) -> Result<()> {
    use wasmparser::{Operator, Parser, Payload};
    const OLD: i32 = 4000;
    const NEW: [u8; 2] = [0xf0, 0x2e]; // LEB128 of 6000
    let mut sites = Vec::new();
    for payload in Parser::new(0).parse_all(bytes) {
        let Ok(Payload::CodeSectionEntry(body)) = payload else {
            continue;
        };
        let Ok(reader) = body.get_operators_reader() else {
            continue;
        };
        let ops: Vec<(Operator, usize)> = reader
            .into_iter_with_offsets()
            .filter_map(std::result::Result::ok)
            .collect();
        for w in ops.windows(4) {
            if let [
                (Operator::I32Const { value: OLD }, at),
                (Operator::I32Eq, _),
                (Operator::BrIf { relative_depth: 0 }, _),
                (Operator::Call { .. }, _),
            ] = w
            {
                sites.push(*at);
            }
        }
    }
    // componentize-py 0.25.1 has one site per parser rule; far fewer means the pattern no
    // longer describes this interpreter, and patching blindly would be wrong.
    if sites.len() < 300 {
        return Err(format!(
            "found {} parser depth checks to raise; expected about 485",
            sites.len()
        ));
    }
    for at in sites {
        if bytes.get(at..at + 3) != Some(&[0x41, 0xa0, 0x1f][..]) {
            return Err(format!(
                "unexpected bytes at offset {at} while raising the parser depth"
            ));
        }
        bytes[at + 1..at + 3].copy_from_slice(&NEW);
    }
    Ok(())
}

/// The table `guest-default/python/pycage_wasm.py` leaves in the snapshot starts with these words.
const IMMORTAL_MAGIC: [u32; 4] = [0x79637970, 0x6D696567, 0x74726F6D, 0x31766C61];

/// [`IMMORTAL_MAGIC`] as it lies in the guest's (little-endian) memory.
fn immortal_magic_bytes() -> Vec<u8> {
    IMMORTAL_MAGIC
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect()
}

/// CPython 3.14's `_Py_IMMORTAL_INITIAL_REFCNT` on a 32-bit build (the count its own
/// `_Py_SetImmortal` gives heap objects; 3.12 and 3.13 used `3 << 29`, which 3.14 reads as a
/// statically allocated object), and the least count it treats as immortal
/// (`_Py_IMMORTAL_MINIMUM_REFCNT`).
const IMMORTAL_REFCNT: u32 = 5 << 28;
const IMMORTAL_MINIMUM: u32 = 1 << 30;

/// Makes the snapshot's objects immortal, so a run never writes their reference counts.
///
/// A run that calls a function, reads a global or creates an instance increments and
/// decrements the counts of snapshot objects, and each first write to a snapshot page is a
/// copy-on-write fault, which the slot's reset must then undo. CPython skips the count of an
/// immortal object. The guest lists its objects at build time (`_immortal_table` in
/// `guest-default/python/pycage_wasm.py`): each object's address and its type's. Here each count in
/// the snapshot's data segments is set to CPython's immortal value, after checking that the
/// word after it (`ob_type`) is the listed type; any mismatch fails the build. The data keeps
/// its length, so the binary keeps its layout. Objects a run creates stay mortal; snapshot
/// objects are never freed, which costs nothing: an instance serves one run and is dropped.
pub(crate) fn immortalize_snapshot(bytes: &mut [u8]) -> Result<()> {
    let image = Image::of_snapshot(bytes)?;
    let at = image.find_table()?;
    let n = image.read(at + 16);
    let mut made = 0usize;
    let mut already = 0usize;
    let mut unwritable = 0usize;
    // Objects the interpreter made immortal itself, at the count this code writes.
    let mut same_count = 0usize;
    for i in 0..n {
        let entry = at + 20 + 8 * i;
        let (object, ty) = (image.read(entry), image.read(entry + 4));
        if image.read(object + 4) != ty {
            return Err(format!(
                "snapshot object {i} of {n} at {object:#x} does not have its listed type {ty:#x}"
            ));
        }
        match image.read(object) {
            0 => return Err(format!("snapshot object at {object:#x} has no references")),
            count if count >= IMMORTAL_MINIMUM => {
                already += 1;
                same_count += usize::from(count == IMMORTAL_REFCNT);
            }
            _ if image.write(bytes, object, IMMORTAL_REFCNT) => made += 1,
            _ => unwritable += 1,
        }
    }
    // Nearly every object should have been made immortal here; far fewer means the table
    // or this interpreter's layout is not what this code expects.
    if made < (n as usize) / 2 {
        return Err(format!(
            "made {made} of {n} snapshot objects immortal ({already} already were, \
             {unwritable} lie outside the data segments)"
        ));
    }
    // The interpreter's own heap objects made immortal (interned strings) carry its count;
    // none at this one means this is not the interpreter the constant was taken from.
    if same_count == 0 {
        return Err(format!(
            "none of the {already} objects the interpreter made immortal has the count \
             {IMMORTAL_REFCNT:#x}; its immortal count has changed"
        ));
    }
    Ok(())
}

/// The guest heap's initial contents: the active data segments, at constant addresses, of
/// the one core module that holds the immortal table. Bytes no segment covers are zero.
struct Image {
    /// (memory address, offset in the component, length), sorted by address.
    segments: Vec<(u32, usize, usize)>,
    /// The component's bytes, as read.
    bytes: Vec<u8>,
}

impl Image {
    fn of_snapshot(bytes: &[u8]) -> Result<Image> {
        use wasmparser::{DataKind, Encoding, Operator, Parser, Payload};
        let base = bytes.as_ptr() as usize;
        let mut modules: Vec<Vec<(u32, usize, usize)>> = Vec::new();
        for payload in Parser::new(0).parse_all(bytes) {
            match payload {
                Ok(Payload::Version {
                    encoding: Encoding::Module,
                    ..
                }) => modules.push(Vec::new()),
                Ok(Payload::DataSection(reader)) => {
                    let Some(segments) = modules.last_mut() else {
                        return Err("a data section outside any core module".into());
                    };
                    for data in reader {
                        let data = data.map_err(|e| format!("data segment: {e}"))?;
                        let DataKind::Active {
                            memory_index: 0,
                            offset_expr,
                        } = data.kind
                        else {
                            continue;
                        };
                        if let Ok(Operator::I32Const { value }) =
                            offset_expr.get_operators_reader().read()
                        {
                            let offset = data.data.as_ptr() as usize - base;
                            segments.push((value as u32, offset, data.data.len()));
                        }
                    }
                }
                Ok(_) => {}
                Err(e) => return Err(format!("parsing the component: {e}")),
            }
        }
        let magic = immortal_magic_bytes();
        let mut holders = modules.into_iter().filter(|segments| {
            segments
                .iter()
                .any(|&(_, at, len)| bytes[at..at + len].windows(16).any(|w| w == magic))
        });
        let (Some(mut segments), None) = (holders.next(), holders.next()) else {
            return Err(
                "expected exactly one core module with the immortal table in its data (the \
                 guest writes it when componentize-py looks up `random.seed` at build time; \
                 see `_finish_at_last_lookup` in guest-default/python/pycage_wasm.py)"
                    .into(),
            );
        };
        segments.sort_unstable();
        if segments
            .windows(2)
            .any(|w| w[0].0 as usize + w[0].2 > w[1].0 as usize)
        {
            return Err("the snapshot's data segments overlap".into());
        }
        Ok(Image {
            segments,
            bytes: bytes.to_vec(),
        })
    }

    /// Where in the component the byte at `addr` is stored, if a segment covers it.
    fn locate(&self, addr: u32) -> Option<usize> {
        let i = self
            .segments
            .partition_point(|&(start, _, _)| start <= addr);
        let &(start, at, len) = self.segments.get(i.checked_sub(1)?)?;
        let delta = (addr - start) as usize;
        (delta < len).then_some(at + delta)
    }

    fn read(&self, addr: u32) -> u32 {
        let mut word = [0u8; 4];
        for (k, b) in word.iter_mut().enumerate() {
            if let Some(at) = addr.checked_add(k as u32).and_then(|a| self.locate(a)) {
                *b = self.bytes[at];
            }
        }
        u32::from_le_bytes(word)
    }

    /// Writes `value` at `addr` in `out` (the component), if every byte that must change is
    /// covered by a segment; returns whether it did.
    fn write(&self, out: &mut [u8], addr: u32, value: u32) -> bool {
        let places: Vec<Option<usize>> = (0..4)
            .map(|k| addr.checked_add(k).and_then(|a| self.locate(a)))
            .collect();
        let value = value.to_le_bytes();
        if places.iter().zip(value).any(|(p, b)| p.is_none() && b != 0) {
            return false;
        }
        for (place, b) in places.into_iter().zip(value) {
            if let Some(at) = place {
                out[at] = b;
            }
        }
        true
    }

    /// The address of the one complete table: the magic, a count `n`, `n` pairs, then `!n`.
    /// Freed memory can hold stale starts of it; only one has the end mark where it belongs.
    fn find_table(&self) -> Result<u32> {
        let magic = immortal_magic_bytes();
        let mut found = Vec::new();
        for &(start, at, len) in &self.segments {
            for (pos, w) in self.bytes[at..at + len].windows(16).enumerate() {
                if w != magic {
                    continue;
                }
                let table = start + pos as u32;
                let n = self.read(table + 16);
                if n < 1 << 24 && self.read(table + 20 + 8 * n) == !n {
                    found.push(table);
                }
            }
        }
        match found[..] {
            [table] => Ok(table),
            _ => Err(format!(
                "expected one immortal table in the snapshot, found {}",
                found.len()
            )),
        }
    }
}
