//! `hrperf import --stap FILE`: `!`-separated stack-count text to an llc-stack capture.
//!
//! SystemTap scripts (`print_stack`-style aggregation with `sprint_backtrace()` joined by
//! `!`) and perf post-processing scripts print one stack per line: frames joined by `!`,
//! then whitespace and a count:
//!
//! ```text
//! vfs_read+0x5/0x90!ksys_read+0x71/0xf0!do_syscall_64 1234
//! 0xffffffff81234567 : tcp_sendmsg+0x5/0x90 [kernel]!sock_sendmsg+0x3e/0x50 [kernel] 17
//! ```
//!
//! Innermost frame first (or, with [`StapOptions::root_first`], outermost first). A frame
//! `[0xADDR : ]sym[+0xOFF[/0xSIZE]][ [module]]` stands for the function `sym` (of
//! `module`); a bare `0xADDR` stays that address's text. Blank lines and lines starting
//! with `#` are skipped.
//!
//! Each distinct function gets a synthetic address (16 bytes apart from
//! [`SYNTHETIC_BASE`]), mapped back by one `SYM_TABLE` for pid 0; each line becomes one
//! record whose **kernel** frames are the stack (stap stacks are not split into kernel
//! and user parts) and whose weight is the count (`STK_IMPORTED | STK_NO_USER_STACK`).
//! A malformed line ends the import at that line (everything before it is written) with
//! [`ImportSummary::damage`] naming it, or with [`StapOptions::skip_bad`] is counted in
//! [`ImportSummary::skipped`] and skipped.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufRead, BufReader};
use std::path::Path;

use hrperf_abi::capture::SYM_TABLE;
use hrperf_abi::record::{MISC_KERNEL, MISC_OVERFLOW};
use hrperf_fmt_llc_stack::record::{StackFixed, STK_IMPORTED, STK_KERNEL_IP, STK_NO_USER_STACK};

use super::{llc_stack_meta, ImportError, ImportSummary, StackSink};

/// First synthetic address given to a function.
pub const SYNTHETIC_BASE: u64 = 0xffff_c000_0000_0000;
/// Bytes between two synthetic addresses (the size each function gets in the table).
const SYNTHETIC_STEP: u64 = 16;

/// Options of [`import_stap`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StapOptions {
    /// Frames are listed outermost (root) first instead of innermost first.
    pub root_first: bool,
    /// Count and skip malformed lines instead of stopping at the first.
    pub skip_bad: bool,
}

/// Why a line is not a stack-count line.
#[derive(Debug, PartialEq, Eq)]
enum LineError {
    NoCount,
    BadCount(String),
    EmptyFrame(usize),
}

impl std::fmt::Display for LineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LineError::NoCount => {
                f.write_str("expected frames joined by '!', whitespace and a count")
            }
            LineError::BadCount(c) => write!(f, "count '{c}' is not a whole number"),
            LineError::EmptyFrame(i) => write!(f, "frame {} is empty", i + 1),
        }
    }
}

/// Splits a line into its frames' text and its count.
fn split_line(line: &str) -> Result<(Vec<&str>, u64), LineError> {
    let line = line.trim();
    let cut = line
        .rfind(|c: char| c.is_whitespace())
        .ok_or(LineError::NoCount)?;
    let (stack, count) = (line[..cut].trim_end(), line[cut..].trim());
    let count: u64 = count
        .parse()
        .map_err(|_| LineError::BadCount(count.chars().take(40).collect()))?;
    if stack.is_empty() {
        return Err(LineError::NoCount);
    }
    let frames: Vec<&str> = stack.split('!').map(str::trim).collect();
    if let Some(i) = frames.iter().position(|f| f.is_empty()) {
        return Err(LineError::EmptyFrame(i));
    }
    Ok((frames, count))
}

/// The function (and module, if named) a frame stands for.
fn frame_function(frame: &str) -> (&str, &str) {
    let mut f = frame.trim();
    // `0xffffffff81234567 : sym+0x5/0x90 [kernel]`
    if let Some((addr, rest)) = f.split_once(" : ") {
        if addr.trim().starts_with("0x") && !rest.trim().is_empty() {
            f = rest.trim();
        }
    }
    let mut module = "";
    if f.ends_with(']') {
        if let Some(open) = f.rfind(" [") {
            module = &f[open + 2..f.len() - 1];
            f = f[..open].trim_end();
        }
    }
    if let Some(plus) = f.rfind("+0x") {
        if plus > 0 {
            f = &f[..plus];
        }
    }
    (f, module)
}

/// Imports stack-count text from `input` into an llc-stack capture at `output`.
/// `progress(bytes_read, file_size)` is called every few thousand lines.
///
/// Errors only if the input cannot be opened or read or the output cannot be written;
/// a malformed line is reported in [`ImportSummary::damage`] (see the module docs).
pub fn import_stap(
    input: &Path,
    output: &Path,
    opts: &StapOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<ImportSummary, ImportError> {
    let read_err = |source: io::Error| ImportError::Read {
        path: input.to_owned(),
        source,
    };
    let file = File::open(input).map_err(read_err)?;
    let total = file.metadata().map_err(read_err)?.len();
    let mut reader = BufReader::with_capacity(1 << 20, file);
    let mut sink = StackSink::create(output, &llc_stack_meta())?;
    let mut summary = ImportSummary::default();
    let mut addrs: HashMap<(String, String), u64> = HashMap::new();
    let mut table = String::new();
    let mut frames: Vec<u64> = Vec::with_capacity(128);
    let mut buf = Vec::with_capacity(4096);
    let mut done: u64 = 0;
    let mut lineno: u64 = 0;
    let mut first_bad: Vec<u64> = Vec::new();
    loop {
        buf.clear();
        let n = reader.read_until(b'\n', &mut buf).map_err(read_err)?;
        if n == 0 {
            break;
        }
        done += n as u64;
        lineno += 1;
        if lineno % 16384 == 0 {
            progress(done, total);
        }
        let line = String::from_utf8_lossy(&buf);
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        let (names, count) = match split_line(t) {
            Ok(x) => x,
            Err(e) => {
                if opts.skip_bad {
                    summary.skip("malformed line");
                    if first_bad.len() < 5 {
                        first_bad.push(lineno);
                    }
                    continue;
                }
                summary.damage = Some(format!("{}:{lineno}: {e}", input.display()));
                break;
            }
        };
        summary.samples += 1;
        summary.stacks += 1;
        frames.clear();
        for name in &names {
            let (func, module) = frame_function(name);
            let key = (func.to_owned(), module.to_owned());
            let next = SYNTHETIC_BASE + addrs.len() as u64 * SYNTHETIC_STEP;
            let addr = *addrs.entry(key).or_insert_with(|| {
                use std::fmt::Write;
                let _ = if module.is_empty() {
                    writeln!(table, "{next:x} {SYNTHETIC_STEP:x} {func}")
                } else {
                    writeln!(table, "{next:x} {SYNTHETIC_STEP:x} {func} [{module}]")
                };
                next
            });
            frames.push(addr);
        }
        if opts.root_first {
            frames.reverse();
        }
        let fixed = StackFixed {
            misc: MISC_OVERFLOW | MISC_KERNEL,
            time_ns: lineno,
            ip: frames[0],
            weight: count,
            flags: STK_IMPORTED | STK_NO_USER_STACK | STK_KERNEL_IP,
            ..StackFixed::default()
        };
        sink.push(&mut summary, fixed, &frames, &[])?;
    }
    progress(done, total);
    if !first_bad.is_empty() {
        let lines: Vec<String> = first_bad.iter().map(u64::to_string).collect();
        summary.notes.push(format!(
            "skipped malformed lines (first: {})",
            lines.join(", ")
        ));
    }
    if !table.is_empty() {
        sink.symbols(&mut summary, SYM_TABLE, 0, table.as_bytes())?;
    }
    sink.finish()?;
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_become_function_names() {
        assert_eq!(frame_function("vfs_read+0x5/0x90"), ("vfs_read", ""));
        assert_eq!(
            frame_function("0xffffffff81234567 : tcp_sendmsg+0x5/0x90 [kernel]"),
            ("tcp_sendmsg", "kernel")
        );
        assert_eq!(frame_function("do_syscall_64"), ("do_syscall_64", ""));
        assert_eq!(
            frame_function("xfs_read+0x10/0x20 [xfs]"),
            ("xfs_read", "xfs")
        );
        assert_eq!(
            frame_function("0xffffffff81234567"),
            ("0xffffffff81234567", "")
        );
        assert_eq!(frame_function("operator+0x1"), ("operator", ""));
        assert_eq!(
            frame_function("+0x10"),
            ("+0x10", ""),
            "no name: kept whole"
        );
    }

    #[test]
    fn lines_split_into_frames_and_count() {
        let (f, c) = split_line("a+0x1/0x2!b!c 1234").unwrap();
        assert_eq!((f, c), (vec!["a+0x1/0x2", "b", "c"], 1234));
        let (f, c) = split_line(
            "0xffffffff81234567 : x+0x5/0x90 [kernel]!0xffffffff8100 : y+0x1/0x2 [kernel]\t7",
        )
        .unwrap();
        assert_eq!(f.len(), 2);
        assert_eq!(c, 7);
        assert_eq!(split_line("lonely"), Err(LineError::NoCount));
        assert_eq!(
            split_line("a!b x12"),
            Err(LineError::BadCount("x12".into()))
        );
        assert_eq!(split_line("a!!b 3"), Err(LineError::EmptyFrame(1)));
        assert_eq!(split_line("a!b -3"), Err(LineError::BadCount("-3".into())));
    }
}
