//! Folded stacks (the collapsed format of flamegraph.pl, inferno and speedscope) and
//! SVG flame graphs drawn by inferno.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use super::profile::{Profile, WeightBy};
use super::StackError;

/// A frame name made safe for the folded format: `;` separates frames and a line ends
/// at a newline, so neither may appear inside one.
fn push_clean(out: &mut String, name: &str) {
    for c in name.chars() {
        out.push(match c {
            ';' => ':',
            '\n' | '\r' => ' ',
            c => c,
        });
    }
}

impl Profile {
    /// The folded lines (`root;...;leaf`, the comm first if `with_comm`) with their
    /// weights, merged and sorted lexically; zero weights are left out.
    pub fn folded_lines(&self, with_comm: bool) -> BTreeMap<String, u64> {
        let mut lines: BTreeMap<String, u64> = BTreeMap::new();
        let mut s = String::new();
        for st in &self.stacks {
            if st.weight == 0 {
                continue;
            }
            s.clear();
            if with_comm {
                // As stackcollapse-perf.pl: spaces in the process name become '_'.
                push_clean(&mut s, &self.comm_name(st.comm).replace(' ', "_"));
            }
            for &f in st.funcs.iter().rev() {
                if !s.is_empty() {
                    s.push(';');
                }
                push_clean(&mut s, &self.funcs[f as usize].name);
            }
            match lines.get_mut(s.as_str()) {
                Some(w) => *w = w.saturating_add(st.weight),
                None => {
                    lines.insert(s.clone(), st.weight);
                }
            }
        }
        lines
    }

    /// Writes the folded stacks: one line `root;...;leaf WEIGHT` per distinct
    /// symbolized stack, sorted lexically (the comm first if `with_comm`, like
    /// stackcollapse-perf.pl).
    pub fn folded(&self, out: &mut impl Write, with_comm: bool) -> Result<(), StackError> {
        let io = |source| StackError::Io {
            what: "folded stacks".into(),
            source,
        };
        for (line, w) in self.folded_lines(with_comm) {
            writeln!(out, "{line} {w}").map_err(io)?;
        }
        out.flush().map_err(io)
    }

    /// Draws the profile as an SVG flame graph (inferno) into `path`, titled `title`.
    pub fn flamegraph(&self, path: &Path, title: &str, with_comm: bool) -> Result<(), StackError> {
        let lines: Vec<String> = self
            .folded_lines(with_comm)
            .into_iter()
            .map(|(l, w)| format!("{l} {w}"))
            .collect();
        if lines.is_empty() {
            return Err(StackError::Empty {
                path: path.to_path_buf(),
            });
        }
        let io = |source| StackError::Io {
            what: path.display().to_string(),
            source,
        };
        let mut out = BufWriter::new(File::create(path).map_err(io)?);
        let mut opts = inferno::flamegraph::Options::default();
        opts.title = title.to_string();
        opts.count_name = match self.options().weight {
            WeightBy::Weight => "events".into(),
            WeightBy::Samples => "samples".into(),
        };
        inferno::flamegraph::from_lines(&mut opts, lines.iter().map(String::as_str), &mut out).map_err(io)?;
        out.flush().map_err(io)
    }
}
