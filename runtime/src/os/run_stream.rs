//! [`RunStream`]: one output stream (stdout or stderr) of a session's guest process, which
//! outlives its runs, cut into runs.
//!
//! The host starts each run with a fresh random marker; the guest writes the marker to the
//! stream when the run ends, before it sends the run's result. What arrives after the run
//! began and before its marker is that run's output, kept in a [`CapturePipe`] with the run's
//! cap; the marker itself is removed, and what arrives between runs (a thread the code left
//! running) is dropped. The guest is not trusted to bound anything: the host keeps at most
//! the run's cap plus one marker's length, whatever arrives.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::Notify;

use crate::capture::{CapturePipe, Captured};

/// One stream of a session's guest. Clones share the stream.
#[derive(Clone, Debug, Default)]
pub(crate) struct RunStream(Arc<Shared>);

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    /// Told when the run's marker arrives or the stream ends.
    changed: Notify,
}

#[derive(Debug, Default)]
struct State {
    /// The run in progress; `None` between runs.
    run: Option<Run>,
    /// The stream has ended (the process closed it, or is gone).
    closed: bool,
}

#[derive(Debug)]
struct Run {
    pipe: CapturePipe,
    marker: Vec<u8>,
    /// The stream's last bytes while they may be the start of the marker.
    held: Vec<u8>,
    /// The marker has arrived: the run's output is complete.
    marked: bool,
}

impl RunStream {
    /// Starts a run: output from now on is kept (at most `cap` bytes, head and tail) until
    /// `marker` arrives.
    pub(crate) fn begin(&self, cap: u64, marker: &[u8]) {
        self.lock().run = Some(Run {
            pipe: CapturePipe::new(cap),
            marker: marker.to_vec(),
            held: Vec::new(),
            marked: false,
        });
    }

    /// Takes what the run wrote once its marker has arrived (or the stream has ended), or
    /// after `grace` at most (a guest that closed or redirected the stream sends no marker);
    /// output after that belongs to no run.
    pub(crate) async fn finish(&self, grace: Duration) -> Captured {
        let deadline = tokio::time::Instant::now() + grace;
        loop {
            // Made before the look, so a change in between is not missed.
            let changed = self.0.changed.notified();
            {
                let state = self.lock();
                let done = state.closed || state.run.as_ref().is_none_or(|r| r.marked);
                if done {
                    break;
                }
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                break;
            }
        }
        self.take()
    }

    /// Takes what the run wrote so far, and ends the run.
    pub(crate) fn take(&self) -> Captured {
        match self.lock().run.take() {
            Some(run) => {
                if !run.marked {
                    run.pipe.push(&run.held);
                }
                run.pipe.captured()
            }
            None => CapturePipe::new(0).captured(),
        }
    }

    /// Feeds bytes as they arrive from the process.
    pub(crate) fn push(&self, bytes: &[u8]) {
        let mut state = self.lock();
        let Some(run) = state.run.as_mut().filter(|r| !r.marked) else {
            return;
        };
        let mut data = std::mem::take(&mut run.held);
        data.extend_from_slice(bytes);
        if let Some(at) = find(&data, &run.marker) {
            run.pipe.push(&data[..at]);
            run.marked = true;
            drop(state);
            self.0.changed.notify_one();
            return;
        }
        let keep = partial_suffix(&data, &run.marker);
        let (out, held) = data.split_at(data.len() - keep);
        run.pipe.push(out);
        run.held = held.to_vec();
    }

    /// Marks the stream as ended.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.0.changed.notify_one();
    }

    /// Copies `stream` in until it ends, then closes.
    pub(crate) async fn pump<R: AsyncRead + Unpin>(self, mut stream: R) {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => self.push(&buf[..n]),
            }
        }
        self.close();
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.0.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Where `needle` first occurs in `haystack`.
fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return None;
    }
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The length of the longest end of `data` that is a proper start of `marker`.
fn partial_suffix(data: &[u8], marker: &[u8]) -> usize {
    let longest = marker.len().saturating_sub(1).min(data.len());
    (1..=longest)
        .rev()
        .find(|&k| data.ends_with(&marker[..k]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_millis(50);

    #[tokio::test]
    async fn a_run_keeps_what_came_before_its_marker_even_split_across_reads() {
        let s = RunStream::default();
        s.push(b"before any run");
        s.begin(1024, b"<END>");
        s.push(b"hello <E");
        s.push(b"N");
        s.push(b"D> after");
        let out = s.finish(GRACE).await;
        assert_eq!(out.text, "hello ");
        s.push(b"between runs");
        s.begin(1024, b"<END2>");
        s.push(b"<EN almost, then <END2>");
        assert_eq!(s.finish(GRACE).await.text, "<EN almost, then ");
    }

    #[tokio::test]
    async fn without_a_marker_the_run_ends_after_the_grace_or_at_the_streams_end() {
        let s = RunStream::default();
        s.begin(1024, b"<END>");
        s.push(b"no marker <EN");
        let started = std::time::Instant::now();
        assert_eq!(s.finish(GRACE).await.text, "no marker <EN");
        assert!(started.elapsed() >= GRACE);
        s.begin(1024, b"<END>");
        s.push(b"cut");
        s.close();
        assert_eq!(s.finish(Duration::from_secs(30)).await.text, "cut");
    }

    #[tokio::test]
    async fn the_host_keeps_the_cap_however_much_arrives() {
        let s = RunStream::default();
        s.begin(100, b"<END>");
        for _ in 0..1000 {
            s.push(&[b'x'; 1000]);
        }
        s.push(b"<END>");
        let out = s.finish(GRACE).await;
        assert!(out.truncated);
        assert!(out.text.len() < 300, "{}", out.text.len());
    }

    #[test]
    fn partial_suffixes() {
        assert_eq!(partial_suffix(b"abc<EN", b"<END>"), 3);
        assert_eq!(partial_suffix(b"abc", b"<END>"), 0);
        assert_eq!(partial_suffix(b"<END", b"<END>"), 4);
        assert_eq!(partial_suffix(b"", b"<END>"), 0);
    }
}
