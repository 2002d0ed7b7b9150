//! [`RunResult::for_model`]: a run's result as compact text for a language model, bounded
//! in size whatever the run produced.

use std::fmt::Write;

use crate::result::thousands;
use crate::{OutputFile, RunResult};

/// The default bound of [`RunResult::for_model`], in bytes: 8 KiB.
pub const MODEL_TEXT_BYTES: usize = 8 * 1024;

impl RunResult {
    /// The result as compact text for a model, at most [`MODEL_TEXT_BYTES`] long; see
    /// [`for_model_within`](Self::for_model_within).
    pub fn for_model(&self) -> String {
        self.for_model_within(MODEL_TEXT_BYTES)
    }

    /// The result as compact text for a model, at most `max_bytes` bytes of UTF-8: whether it
    /// succeeded or the error's kind, whether it timed out, the error's message and the last
    /// lines of its traceback, the value (JSON), the end of stdout and stderr, the number of
    /// tool calls, and the produced files' names and sizes.
    ///
    /// Each part is shown whole when the bound allows; otherwise the parts share the bound
    /// (a short part whole, the long ones cut to equal shares), and a cut part says how much
    /// was cut: `[... 1,048,000 bytes cut ...]`. The value and the message keep their start,
    /// stdout, stderr and the traceback their end (the most recent lines), the file list its
    /// first entries and a count of the rest. Cuts fall on character boundaries. Under a few
    /// hundred bytes the bound still holds, but only the first lines fit.
    ///
    /// ```
    /// let result = pycage::RunResult::builder("wasm", Ok(serde_json::json!(15))).build();
    /// assert_eq!(result.for_model(), "ok\nvalue: 15\n");
    /// ```
    pub fn for_model_within(&self, max_bytes: usize) -> String {
        let mut head = String::new();
        match &self.error {
            None => head.push_str("ok\n"),
            Some(error) => {
                let _ = writeln!(head, "error: {}", error.kind);
            }
        }
        if self.timed_out {
            head.push_str("timed out: the wall-clock limit ended the run\n");
        }
        if self.tool_calls > 0 {
            let _ = writeln!(head, "tool calls: {}", self.tool_calls);
        }

        let mut parts = Vec::new();
        if let Some(error) = &self.error {
            parts.push(Part::new("message", error.message.clone(), Keep::Head));
            if let Some(tb) = error.traceback.as_deref().filter(|t| !t.is_empty()) {
                parts.push(Part::new(
                    "traceback (last lines)",
                    tb.trim_end().to_owned(),
                    Keep::Tail,
                ));
            }
        }
        if self.error.is_none() || !self.value.is_null() {
            parts.push(Part::new("value", self.value.to_string(), Keep::Head));
        }
        for (label, text) in [("stdout", &self.stdout), ("stderr", &self.stderr)] {
            if !text.is_empty() {
                parts.push(Part::new(label, text.trim_end().to_owned(), Keep::Tail));
            }
        }
        if !self.files.is_empty() {
            parts.push(Part::files(&self.files));
        }

        let overhead: usize = parts.iter().map(Part::overhead).sum();
        let budget = max_bytes.saturating_sub(head.len() + overhead);
        let shares = share(budget, &parts.iter().map(Part::len).collect::<Vec<_>>());
        let mut out = head;
        for (part, share) in parts.iter().zip(shares) {
            part.render_into(&mut out, share);
        }
        truncate(&mut out, max_bytes);
        out
    }
}

/// Which end of a part is kept when it is cut.
enum Keep {
    Head,
    Tail,
    /// The first files, then a count of the rest.
    Files(Vec<String>, u64),
}

struct Part {
    label: &'static str,
    text: String,
    keep: Keep,
}

impl Part {
    fn new(label: &'static str, text: String, keep: Keep) -> Self {
        Part { label, text, keep }
    }

    fn files(files: &[OutputFile]) -> Self {
        let entries: Vec<String> = files
            .iter()
            .map(|f| {
                let path: String = f
                    .path
                    .chars()
                    .map(|c| if c.is_control() { '?' } else { c })
                    .collect();
                format!("- {path} ({} bytes)", thousands(f.size))
            })
            .collect();
        let total = files.iter().fold(0u64, |sum, f| sum.saturating_add(f.size));
        Part::new("files", entries.join("\n"), Keep::Files(entries, total))
    }

    fn len(&self) -> usize {
        self.text.len()
    }

    /// The label and line ends around the text: `label:\n` and `\n`.
    fn overhead(&self) -> usize {
        self.label.len() + 3
    }

    /// `label: text` on one line, or `label:` and the text below it; the text cut to `max`.
    fn render_into(&self, out: &mut String, max: usize) {
        let text = match &self.keep {
            Keep::Head => head(&self.text, max),
            Keep::Tail => tail(&self.text, max),
            Keep::Files(entries, total) => first_files(entries, *total, max),
        };
        let sep = if text.contains('\n') || matches!(self.keep, Keep::Files(..)) {
            '\n'
        } else {
            ' '
        };
        let _ = writeln!(out, "{}:{sep}{text}", self.label);
    }
}

/// Shares `budget` among parts of the given lengths: parts that fit an equal share get their
/// length, and what they leave is shared among the rest (max-min fairness).
fn share(budget: usize, lengths: &[usize]) -> Vec<usize> {
    let mut shares = vec![0; lengths.len()];
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    order.sort_by_key(|&i| lengths[i]);
    let mut left = budget;
    for (n, &i) in order.iter().enumerate() {
        let equal = left / (lengths.len() - n);
        shares[i] = lengths[i].min(equal);
        left -= shares[i];
    }
    shares
}

/// The marker for `cut` bytes cut.
fn marker(cut: usize) -> String {
    format!("[... {} bytes cut ...]", thousands(cut as u64))
}

/// How many bytes of `text` to keep so that what is kept and the marker fit `max`.
fn kept_bytes(text: &str, max: usize) -> usize {
    // The marker is longest when the most is cut; sized for that, it always fits.
    max.saturating_sub(marker(text.len()).len() + 1)
}

/// `text`'s start within `max` bytes, with a marker after it when cut.
fn head(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let end = floor_char_boundary(text, kept_bytes(text, max));
    format!("{} {}", &text[..end], marker(text.len() - end))
}

/// `text`'s end within `max` bytes, from a line start where one is near, with a marker
/// before it when cut.
fn tail(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let keep = kept_bytes(text, max);
    let mut start = ceil_char_boundary(text, text.len() - keep);
    let near = (keep / 4).min(200);
    if let Some(nl) = text[start..].find('\n').filter(|&nl| nl < near) {
        start += nl + 1;
    }
    format!("{}\n{}", marker(start), &text[start..])
}

/// The first entries that fit `max` bytes, then how many more there are and their size.
fn first_files(entries: &[String], total: u64, max: usize) -> String {
    let all = entries.join("\n");
    if all.len() <= max {
        return all;
    }
    let rest = |n: usize| {
        format!(
            "[... and {} more files; {} files, {} bytes in all ...]",
            thousands(n as u64),
            thousands(entries.len() as u64),
            thousands(total)
        )
    };
    let reserve = rest(entries.len()).len() + 1;
    let mut out = String::new();
    let mut shown = 0;
    for entry in entries {
        if out.len() + entry.len() + 1 + reserve > max {
            break;
        }
        out.push_str(entry);
        out.push('\n');
        shown += 1;
    }
    out.push_str(&rest(entries.len() - shown));
    out
}

/// Cuts `text` to at most `max` bytes, on a character boundary.
fn truncate(text: &mut String, max: usize) {
    if text.len() > max {
        let end = floor_char_boundary(text, max);
        text.truncate(end);
    }
}

/// The largest character boundary of `text` at or before `i`.
fn floor_char_boundary(text: &str, i: usize) -> usize {
    let mut i = i.min(text.len());
    while !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// The smallest character boundary of `text` at or after `i`.
fn ceil_char_boundary(text: &str, i: usize) -> usize {
    let mut i = i.min(text.len());
    while !text.is_char_boundary(i) {
        i += 1;
    }
    i
}

#[cfg(test)]
#[path = "render_tests.rs"]
mod tests;
