//! A simulated PEBS assist (what the CPU's microcode does on a PEBS counter overflow),
//! and the zero-copy reader of the record area.
//!
//! The assist ([`assist`]) follows the SDM's description of the PEBS assist: if the
//! record fits below `pebs_absolute_maximum`, write it at `pebs_index` in the configured
//! layout, advance `pebs_index` by the record size, and raise the PMI when
//! `pebs_index` reached `pebs_interrupt_threshold`; the counter is reloaded from its
//! `pebs_event_reset` slot. A record that does not fit is not written (the simulator
//! counts it in `PebsHeader::lost`; real hardware does not count it).
//!
//! The reader ([`view`]) gives the records between `pebs_buffer_base` and `pebs_index`
//! in place, and [`drain`] wraps each into a capture record (see `record`).

use hrperf_engine::Buffer;

use super::datasrc::DsrcKind;
use super::ds::{self, Counter};
use super::format::{self, PebsHeader};
use super::layout::{self, Layout, LayoutError, PebsFormat, PebsRecord, PebsSample};
use super::record::{self, Prefix, MAX_CAPTURE_RECORD};

/// What one assist did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AssistOutcome {
    /// The record was written.
    pub written: bool,
    /// Byte offset of the record in the area (where it was or would have been written).
    pub offset: u64,
    /// `pebs_index` reached the interrupt threshold: the CPU raises the PMI (and sets
    /// IA32_PERF_GLOBAL_STATUS.BUFFER_OVF).
    pub pmi: bool,
    /// No room for this record (it was lost).
    pub full: bool,
    /// The value the counter is reloaded with (its DS reset slot).
    pub reload: u64,
}

/// Why the assist or the reader cannot work on a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AssistError {
    /// The buffer has no consistent PEBS header (not initialised by this format).
    NotPebs,
    /// The DS area's pointers are outside the record area or misaligned.
    Corrupt,
    /// The counter has no PEBS reset slot in this format.
    BadCounter,
    /// The sample cannot be encoded in the configured layout.
    Encode(LayoutError),
}

/// The validated geometry of a buffer's record area.
#[derive(Clone, Copy, Debug)]
struct Area {
    hdr: PebsHeader,
    layout: Layout,
    base: u64,
    index: u64,
    threshold: u64,
    max: u64,
}

fn area(buf: &Buffer<'_>) -> Result<(Area, ds::DsArea), AssistError> {
    let hdr = format::read_header(buf).ok_or(AssistError::NotPebs)?;
    let layout = Layout::from_id(hdr.layout).ok_or(AssistError::NotPebs)?;
    let d = format::read_ds(buf).ok_or(AssistError::NotPebs)?;
    let a = Area {
        hdr,
        layout,
        base: d.pebs_buffer_base,
        index: d.pebs_index,
        threshold: d.pebs_interrupt_threshold,
        max: d.pebs_absolute_maximum,
    };
    let rs = u64::from(hdr.record_size);
    let ok = a.max.checked_sub(a.base) == Some(hdr.area_size)
        && a.index >= a.base
        && a.index <= a.max
        && (a.index - a.base).checked_rem(rs) == Some(0);
    if ok {
        Ok((a, d))
    } else {
        Err(AssistError::Corrupt)
    }
}

/// Performs one PEBS assist for `counter` with `sample` on `buf` (this CPU's buffer),
/// as the microcode would. `applicable_counters` gets the counter's bit OR-ed in.
pub fn assist(buf: &mut Buffer<'_>, counter: Counter, sample: &PebsSample) -> Result<AssistOutcome, AssistError> {
    let (a, d) = area(buf)?;
    let fmt = PebsFormat(a.hdr.pebs_format);
    let slot = ds::reset_slot(fmt.format(), counter).ok_or(AssistError::BadCounter)?;
    let bit = counter.global_bit().ok_or(AssistError::BadCounter)?;
    let reload = d.pebs_event_reset.get(slot).copied().unwrap_or(0);
    let size = u64::from(a.hdr.record_size);
    let offset = a.index - a.base;
    if a.max - a.index < size {
        format::bump_lost(buf);
        return Ok(AssistOutcome { written: false, offset, pmi: a.index >= a.threshold, full: true, reload });
    }
    let mut s = *sample;
    s.applicable_counters |= 1 << bit;
    if !fmt.has(PebsFormat::TIMING_INFO) {
        s.retire_latency = 0;
    }
    let start = a.hdr.area_offset + offset;
    let end = start + size;
    if end > buf.len() as u64 {
        return Err(AssistError::Corrupt);
    }
    // SAFETY: `start..end` lies inside the buffer (checked) and inside the record area at
    // or after `pebs_index`: bytes the reader never reads (it reads `[base, index)`), and
    // `buf` is borrowed exclusively, so nothing else references them.
    let out = unsafe { core::slice::from_raw_parts_mut(buf.as_mut_ptr().add(start as usize), size as usize) };
    let n = layout::encode(a.layout, a.hdr.data_cfg, &s, out).map_err(AssistError::Encode)?;
    let index = a.index + n as u64;
    if !format::store_index(buf, index) {
        return Err(AssistError::Corrupt);
    }
    Ok(AssistOutcome { written: true, offset, pmi: index >= a.threshold, full: false, reload })
}

/// The records between `pebs_buffer_base` and `pebs_index`, in place.
#[derive(Clone, Copy, Debug)]
pub struct PebsView<'a> {
    /// The format's header at the time of the view.
    pub header: PebsHeader,
    /// The layout.
    pub layout: Layout,
    /// The format word.
    pub pebs_format: PebsFormat,
    /// The data-source interpretation.
    pub dsrc_kind: DsrcKind,
    /// The published record bytes.
    pub bytes: &'a [u8],
}

/// A zero-copy view of `buf`'s records. Valid until the format's `restart` (the reader
/// calls it only after it is done with the view, as the engine's contract says).
pub fn view<'a>(buf: &'a Buffer<'_>) -> Result<PebsView<'a>, AssistError> {
    let (a, _) = area(buf)?;
    let start = a.hdr.area_offset as usize;
    let len = (a.index - a.base) as usize;
    let end = start.checked_add(len).filter(|&e| e <= buf.len()).ok_or(AssistError::Corrupt)?;
    // SAFETY: `start..end` is inside the buffer (checked); these bytes were published by
    // the producer before it advanced `pebs_index` (acquire load in `read_ds`) and are
    // not written again before `restart`, which the caller does not run while `'a` lasts.
    let bytes = unsafe { core::slice::from_raw_parts(buf.as_ptr().add(start), end - start) };
    Ok(PebsView {
        header: a.hdr,
        layout: a.layout,
        pebs_format: PebsFormat(a.hdr.pebs_format),
        dsrc_kind: DsrcKind::from_id(a.hdr.dsrc_kind as u8),
        bytes,
    })
}

impl<'a> PebsView<'a> {
    /// Number of records (for adaptive layouts, of the configured size).
    pub fn len(&self) -> usize {
        self.bytes.len() / (self.header.record_size.max(1) as usize)
    }

    /// Whether no record was written.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The records, decoded in place; an undecodable record ends the iteration with an
    /// error.
    pub fn records(&self) -> Records<'a> {
        Records { layout: self.layout, rest: self.bytes, failed: false }
    }
}

/// Iterator over a view's records.
#[derive(Clone, Debug)]
pub struct Records<'a> {
    layout: Layout,
    rest: &'a [u8],
    failed: bool,
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<PebsRecord<'a>, LayoutError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() || self.failed {
            return None;
        }
        match layout::decode(self.layout, self.rest) {
            Ok(r) => {
                self.rest = self.rest.get(r.size()..).unwrap_or(&[]);
                Some(Ok(r))
            }
            Err(e) => {
                self.failed = true;
                Some(Err(e))
            }
        }
    }
}

/// What [`drain`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DrainStats {
    /// Capture records produced.
    pub records: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Bytes left unread because a record did not decode (0 on a healthy buffer).
    pub undecodable: u64,
}

/// Converts a record's TSC into the capture's clock: `time_ns = time_base +
/// (tsc - tsc_base) * 10^9 / tsc_hz` (the TSC is invariant on every PEBS-capable CPU).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TscClock {
    /// TSC frequency in Hz (non-zero).
    pub tsc_hz: u64,
    /// A TSC value…
    pub tsc_base: u64,
    /// …and the capture-clock time it corresponds to.
    pub time_base: u64,
}

impl TscClock {
    /// The capture-clock time of `tsc` (saturating; `None` without a frequency).
    pub fn ns(&self, tsc: u64) -> Option<u64> {
        if self.tsc_hz == 0 {
            return None;
        }
        let delta = u128::from(tsc.wrapping_sub(self.tsc_base)) * 1_000_000_000 / u128::from(self.tsc_hz);
        Some(self.time_base.saturating_add(u64::try_from(delta).unwrap_or(u64::MAX)))
    }
}

/// Wraps every record of `buf`'s view into a capture record (prefix: `cpu`, the
/// buffer's format word and data-source kind, `flags`) and hands each to `emit`. The
/// records are read in place; the wrapped copy is built in a stack buffer of
/// [`MAX_CAPTURE_RECORD`] bytes (userspace only: the kernel never drains). With a
/// `clock`, records whose layout has a TSC (fmt3, adaptive) get `time_ns` and `FL_TIME`.
pub fn drain<F: FnMut(&[u8])>(
    buf: &Buffer<'_>,
    cpu: u32,
    flags: u32,
    clock: Option<TscClock>,
    mut emit: F,
) -> Result<DrainStats, AssistError> {
    let v = view(buf)?;
    let base = Prefix { cpu, pebs_format: v.pebs_format, dsrc_kind: v.dsrc_kind as u8, flags, time_ns: 0 };
    let mut out = [0u8; MAX_CAPTURE_RECORD];
    let mut st = DrainStats::default();
    let mut consumed = 0usize;
    for r in v.records() {
        let Ok(r) = r else { break };
        let prefix = match clock.zip(r.tsc).and_then(|(c, tsc)| c.ns(tsc)) {
            Some(t) => Prefix { time_ns: t, flags: flags | record::FL_TIME, ..base },
            None => base,
        };
        let n = record::wrap(v.layout, &prefix, r.bytes, &mut out).map_err(|_| AssistError::Corrupt)?;
        emit(out.get(..n).unwrap_or(&[]));
        st.records += 1;
        st.bytes += n as u64;
        consumed += r.size();
    }
    st.undecodable = (v.bytes.len() - consumed.min(v.bytes.len())) as u64;
    Ok(st)
}
