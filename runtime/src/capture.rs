//! Capturing pipes for a guest's stdout and stderr, shared by every backend.
//!
//! A pipe keeps the first and the last bytes of the stream within a fixed budget and counts
//! the rest, so an output flood costs the host a constant amount of memory and the user still
//! sees how the output began and how it ended. Writes are never refused: a guest that prints
//! forever is ended by its time or fuel limit, not by a broken stdout.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi_io::poll::Pollable;
use wasmtime_wasi_io::streams::{OutputStream, StreamResult};

/// The most bytes the guest may hand over in one write. Bounds the host's transient copy.
const WRITE_PERMIT: usize = 64 * 1024;

/// How many bytes a run has written to stdout and to stderr so far, readable while it runs
/// (a server's progress reports use it): give it to
/// [`RunRequest::output_meter`](crate::RunRequest::output_meter). Every byte written counts,
/// kept or cut by the output cap. Clones share the counts. A backend that sees the output only when the run ends
/// (`wasm+bubblewrap`, a session on an OS backend) counts nothing while it runs.
#[derive(Debug, Clone, Default)]
pub struct OutputMeter {
    stdout: Arc<AtomicU64>,
    stderr: Arc<AtomicU64>,
}

impl OutputMeter {
    /// A meter at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes written to stdout so far.
    pub fn stdout_bytes(&self) -> u64 {
        self.stdout.load(Ordering::Relaxed)
    }

    /// Bytes written to stderr so far.
    pub fn stderr_bytes(&self) -> u64 {
        self.stderr.load(Ordering::Relaxed)
    }

    /// The stdout and stderr pipes count into this meter (until their next reset).
    pub(crate) fn attach(&self, stdout: &CapturePipe, stderr: &CapturePipe) {
        stdout.lock().tap = Some(self.stdout.clone());
        stderr.lock().tap = Some(self.stderr.clone());
    }
}

/// A capturing pipe; clones share the same buffer.
#[derive(Clone, Debug)]
pub struct CapturePipe(Arc<Mutex<Capture>>);

#[derive(Debug)]
struct Capture {
    head: Vec<u8>,
    head_cap: usize,
    tail: VecDeque<u8>,
    tail_cap: usize,
    total: u64,
    /// Where every written byte is also counted (an [`OutputMeter`]'s half).
    tap: Option<Arc<AtomicU64>>,
}

/// What a pipe captured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Captured {
    /// The kept head and tail, with a marker where the middle was cut.
    pub text: String,
    /// True when the middle was cut.
    pub truncated: bool,
}

impl CapturePipe {
    /// A pipe keeping at most `budget` bytes: the first half and the last half.
    pub fn new(budget: u64) -> Self {
        let budget = usize::try_from(budget).unwrap_or(usize::MAX);
        let head_cap = budget.div_ceil(2);
        CapturePipe(Arc::new(Mutex::new(Capture {
            head: Vec::new(),
            head_cap,
            tail: VecDeque::new(),
            tail_cap: budget - head_cap,
            total: 0,
            tap: None,
        })))
    }

    /// Empties the pipe and sets a new budget (a pre-instantiated guest learns its run's
    /// output cap only when the run starts).
    pub fn reset(&self, budget: u64) {
        let budget = usize::try_from(budget).unwrap_or(usize::MAX);
        let head_cap = budget.div_ceil(2);
        let mut c = self.lock();
        c.head.clear();
        c.tail.clear();
        c.head_cap = head_cap;
        c.tail_cap = budget - head_cap;
        c.total = 0;
        c.tap = None;
    }

    fn lock(&self) -> MutexGuard<'_, Capture> {
        // A poisoned lock only means another writer panicked mid-append; the bytes are still
        // a valid (if odd) capture.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends bytes (an OS backend feeds a child's output here as it arrives).
    pub fn push(&self, bytes: &[u8]) {
        self.lock().push(bytes);
    }

    /// The captured text: invalid UTF-8 replaced, and a marker where the middle was cut.
    pub fn captured(&self) -> Captured {
        let c = self.lock();
        let kept = (c.head.len() + c.tail.len()) as u64;
        let truncated = c.total > kept;
        let mut text = String::from_utf8_lossy(&c.head).into_owned();
        if truncated {
            text.push_str(&format!(
                "\n[... {} bytes cut by pycage ...]\n",
                c.total - kept
            ));
        }
        let (a, b) = c.tail.as_slices();
        let mut tail = Vec::with_capacity(a.len() + b.len());
        tail.extend_from_slice(a);
        tail.extend_from_slice(b);
        text.push_str(&String::from_utf8_lossy(&tail));
        Captured { text, truncated }
    }
}

impl Capture {
    fn push(&mut self, mut bytes: &[u8]) {
        self.total = self.total.saturating_add(bytes.len() as u64);
        if let Some(tap) = &self.tap {
            tap.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        }
        let room = self.head_cap - self.head.len();
        let into_head = room.min(bytes.len());
        self.head.extend_from_slice(&bytes[..into_head]);
        bytes = &bytes[into_head..];
        if bytes.is_empty() || self.tail_cap == 0 {
            return;
        }
        if bytes.len() >= self.tail_cap {
            self.tail.clear();
            self.tail.extend(&bytes[bytes.len() - self.tail_cap..]);
            return;
        }
        let overflow = (self.tail.len() + bytes.len()).saturating_sub(self.tail_cap);
        self.tail.drain(..overflow);
        self.tail.extend(bytes);
    }
}

impl IsTerminal for CapturePipe {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CapturePipe {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for CapturePipe {
    async fn ready(&mut self) {}
}

#[wasmtime_wasi::async_trait]
impl OutputStream for CapturePipe {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.push(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(WRITE_PERMIT)
    }
}

impl AsyncWrite for CapturePipe {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let n = buf.len().min(WRITE_PERMIT);
        self.push(&buf[..n]);
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capture(budget: u64, writes: &[&[u8]]) -> Captured {
        let pipe = CapturePipe::new(budget);
        for w in writes {
            pipe.push(w);
        }
        pipe.captured()
    }

    #[test]
    fn within_budget_everything_is_kept() {
        let c = capture(10, &[b"abc", b"defg"]);
        assert_eq!(
            c,
            Captured {
                text: "abcdefg".into(),
                truncated: false
            }
        );
        let c = capture(10, &[b"0123456789"]);
        assert_eq!(
            c,
            Captured {
                text: "0123456789".into(),
                truncated: false
            }
        );
    }

    #[test]
    fn over_budget_keeps_head_and_tail_and_marks_the_cut() {
        let c = capture(6, &[b"abcdef", b"ghij", b"k"]);
        assert!(c.truncated);
        assert_eq!(c.text, "abc\n[... 5 bytes cut by pycage ...]\nijk");
        let big = vec![b'x'; 1_000_000];
        let c = capture(256, &[&big]);
        assert!(c.truncated);
        assert_eq!(c.text.matches('x').count(), 256);
    }

    #[test]
    fn zero_budget_keeps_nothing_but_reports_truncation() {
        assert_eq!(
            capture(0, &[]),
            Captured {
                text: String::new(),
                truncated: false
            }
        );
        let c = capture(0, &[b"a"]);
        assert!(c.truncated);
        assert_eq!(c.text, "\n[... 1 bytes cut by pycage ...]\n");
    }

    #[test]
    fn reset_empties_and_rebudgets() {
        let pipe = CapturePipe::new(4);
        pipe.push(b"abcdefgh");
        pipe.reset(100);
        assert_eq!(
            pipe.captured(),
            Captured {
                text: String::new(),
                truncated: false
            }
        );
        pipe.push(b"abcdefgh");
        assert_eq!(
            pipe.captured(),
            Captured {
                text: "abcdefgh".into(),
                truncated: false
            }
        );
    }

    #[test]
    fn invalid_utf8_is_replaced_not_fatal() {
        let c = capture(64, &[b"ok \xff\xfe end"]);
        assert_eq!(c.text, "ok \u{fffd}\u{fffd} end");
    }
}
