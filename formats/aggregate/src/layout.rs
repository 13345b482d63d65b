//! Where everything lives in a CPU's buffer, and the validated configuration.
//!
//! ```text
//! 0          BufferHeader (128 B, the core's)
//! 128        producer-private words (PRIV_*), then the stack scratch
//!            ((max depth + 1) u64s): only the handler and restart touch these
//! data_off   control block (64 B): written by the producer, read by the consumer
//!   +64      consumer line (64 B): written by the consumer only (ack, switch requests)
//!   +128     table 0: TableHeader (128 B) | slots (32 B each) | stack entries
//!   +128+T   table 1: the same
//! ```
//!
//! `data_offset`/`data_size` in the `BufferHeader` cover
//! the control block, the consumer line and both tables: the part userspace reads.
//!
//! A slot is four words: `k0` (the IP, or `kstack_id << 32 | ustack_id`), `tag`
//! (`gen | pid << 32`), `count`, `sum`. A slot whose `gen` is not the table's current
//! generation is empty: a table is emptied by bumping its generation, never by clearing
//! memory, so a switch costs O(1) in the interrupt handler.
//!
//! A stack entry is `tag` (`gen | depth << 32 | flags << 48`), `hash`, then the frames.

use hrperf_abi::BufferHeader;

use super::record::{KEY_IP, KEY_PID_IP, KEY_STACK, MAX_STACK_DEPTH};

/// Offset of the producer-private words.
pub const PRIV_OFFSET: usize = BufferHeader::SIZE;

/// Private word: magic showing `init` ran.
pub(crate) const PRIV_MAGIC: usize = 0;
/// Private word: the interval being filled (its sequence number, ≥ 1).
pub(crate) const PRIV_CUR: usize = 1;
/// Private word: generation tag of the current interval.
pub(crate) const PRIV_GEN: usize = 2;
/// Private word: value of the summed counter at the previous sample.
pub(crate) const PRIV_LAST: usize = 3;
/// Private word: time of the previous sample, [`NO_TIME`] before the first.
pub(crate) const PRIV_LAST_TIME: usize = 4;
/// Private word: the consumer's switch-request count last honoured.
pub(crate) const PRIV_SEEN_REQ: usize = 5;
/// Private word: the interval for which the threshold NOTIFY was returned.
pub(crate) const PRIV_NOTIFIED: usize = 6;
/// Private word: `key | counter << 8 | flags << 16`.
pub(crate) const PRIV_CFG: usize = 7;
/// Private word: slot mask (slots − 1).
pub(crate) const PRIV_MASK: usize = 8;
/// Private word: probe bound (slots tried before "other").
pub(crate) const PRIV_PROBE: usize = 9;
/// Private word: slots used at which the handler switches (`u64::MAX`: never).
pub(crate) const PRIV_THRESHOLD: usize = 10;
/// Private word: offset of table 0.
pub(crate) const PRIV_TABLE0: usize = 11;
/// Private word: bytes of one table.
pub(crate) const PRIV_TABLE_BYTES: usize = 12;
/// Private word: stack-table mask (stack slots − 1), 0 without stacks.
pub(crate) const PRIV_STACK_MASK: usize = 13;
/// Private word: `kdepth | udepth << 16`.
pub(crate) const PRIV_DEPTHS: usize = 14;
/// Private word: stack entries used at which the handler switches.
pub(crate) const PRIV_STACK_THRESHOLD: usize = 15;
/// Private words.
pub(crate) const PRIV_WORDS: usize = 16;
/// Offset of the stack scratch (frames captured before they are looked up).
pub(crate) const SCRATCH_OFFSET: usize = PRIV_OFFSET + PRIV_WORDS * 8;

/// [`PRIV_LAST_TIME`] before any sample.
pub(crate) const NO_TIME: u64 = u64::MAX;
/// [`PRIV_MAGIC`] once `init` ran: "AGGPRIV1".
pub(crate) const PRIV_MAGIC_VALUE: u64 = u64::from_le_bytes(*b"AGGPRIV1");

/// Bytes of the control block.
pub const CONTROL_SIZE: usize = 64;
/// Bytes of the consumer line.
pub const CONSUMER_SIZE: usize = 64;
/// Offset of table 0 from the data area's start.
pub const TABLES_OFFSET: usize = CONTROL_SIZE + CONSUMER_SIZE;

/// Control word (from the data area's start): [`CONTROL_MAGIC`].
pub const C_MAGIC: usize = 0;
/// Control word: `key_kind | counter << 32`.
pub const C_KEY: usize = 8;
/// Control word: `slots | probe << 32`.
pub const C_SLOTS: usize = 16;
/// Control word: `stack_slots | kdepth << 32 | udepth << 48`.
pub const C_STACKS: usize = 24;
/// Control word: bytes of one table.
pub const C_TABLE_BYTES: usize = 32;
/// Control word: the last published (closed) interval, 0 before the first switch.
/// Stored with release ordering after the table is complete.
pub const C_PUBLISHED: usize = 40;
/// Control word: the interval being filled (informational).
pub const C_ACTIVE: usize = 48;
/// Control word: switches the handler wanted but could not make because the consumer
/// had not acknowledged the previous interval (informational).
pub const C_SWITCH_WAITS: usize = 56;
/// Consumer word: the last interval the consumer has finished reading (release).
pub const U_ACK: usize = CONTROL_SIZE;
/// Consumer word: switch requests made so far (the producer switches when it changes).
pub const U_REQ: usize = CONTROL_SIZE + 8;

/// [`C_MAGIC`]: "HRPAGGR1".
pub const CONTROL_MAGIC: u64 = u64::from_le_bytes(*b"HRPAGGR1");

/// Table header word (from the table's start): the interval it holds (0: none yet).
pub const T_SEQ: usize = 0;
/// Table header word: interval start.
pub const T_START: usize = 8;
/// Table header word: interval end.
pub const T_END: usize = 16;
/// Table header word: samples.
pub const T_SAMPLES: usize = 24;
/// Table header word: samples in "other".
pub const T_OTHER_COUNT: usize = 32;
/// Table header word: their deltas.
pub const T_OTHER_SUM: usize = 40;
/// Table header word: samples that went to "other" for lack of a slot.
pub const T_MISSES: usize = 48;
/// Table header word: slots used.
pub const T_USED: usize = 56;
/// Table header word: stack entries used.
pub const T_STACK_USED: usize = 64;
/// Table header word: stacks not stored.
pub const T_STACK_MISSES: usize = 72;
/// Table header word: stacks truncated.
pub const T_STACK_TRUNC: usize = 80;
/// Table header word: multi-wrap samples.
pub const T_MULTI_WRAPS: usize = 88;
/// Table header word: `IV_FL_*`.
pub const T_FLAGS: usize = 96;
/// Table header word: all deltas of the interval.
pub const T_SUM: usize = 104;
/// Bytes of the table header.
pub const TABLE_HEADER_SIZE: usize = 128;
/// Bytes of a slot.
pub const SLOT_SIZE: usize = 32;
/// Bytes of a stack entry's fixed part (tag, hash).
pub const STACK_ENTRY_FIXED: usize = 16;

/// Default table slots.
pub const DEFAULT_SLOTS: u32 = 4096;
/// Fewest table slots.
pub const MIN_SLOTS: u32 = 16;
/// Most table slots (32 MiB per table).
pub const MAX_SLOTS: u32 = 1 << 20;
/// Default probe bound.
pub const DEFAULT_PROBE: u32 = 16;
/// Default switch threshold, per mille of the slots used.
pub const DEFAULT_SWITCH_PERMILLE: u32 = 750;
/// Default stack-table slots.
pub const DEFAULT_STACK_SLOTS: u32 = 1024;
/// Default kernel and user stack depth.
pub const DEFAULT_STACK_DEPTH: u32 = 32;

/// The generation tag of interval `seq`: never 0 (zeroed memory is empty), and equal
/// for two intervals of the same table only `2 * (2^32 - 1)` intervals apart.
pub const fn gen_of(seq: u64) -> u32 {
    (seq % 0xffff_ffff) as u32 + 1
}

/// The table (0 or 1) that holds interval `seq`.
pub const fn table_of(seq: u64) -> usize {
    (seq & 1) as usize
}

/// A session's validated configuration (from `AggregateArg` and the session).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// `KEY_*`.
    pub key: u32,
    /// Index of the summed counter.
    pub counter: u32,
    /// Table slots, a power of two.
    pub slots: u32,
    /// Probe bound, `1..=slots`.
    pub probe: u32,
    /// Switch when this many slots are used; `u64::MAX`: only on request/restart.
    pub threshold: u64,
    /// Stack-table slots (power of two), 0 unless `key == KEY_STACK`.
    pub stack_slots: u32,
    /// Kernel stack depth limit (0: kernel stacks not captured).
    pub kdepth: u32,
    /// User stack depth limit (0: user stacks not captured).
    pub udepth: u32,
    /// Switch when this many stack entries are used.
    pub stack_threshold: u64,
}

/// Where a configuration's parts go in the buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Bytes of producer-private area (words and scratch), from [`PRIV_OFFSET`].
    pub private_size: u64,
    /// Start of the data area (64-aligned).
    pub data_offset: u64,
    /// Bytes of the data area.
    pub data_size: u64,
    /// Offset of table 0 (table 1 follows it).
    pub table0: u64,
    /// Bytes of one table.
    pub table_bytes: u64,
    /// Bytes of one stack entry (0 without stacks).
    pub stack_entry: u64,
    /// Bytes the whole buffer needs.
    pub buf_size: u64,
}

impl Config {
    /// Largest of the two depth limits.
    pub fn max_depth(&self) -> u32 {
        self.kdepth.max(self.udepth)
    }

    /// Where everything goes; `None` if a size overflows or the configuration breaks
    /// its rules (power-of-two slot counts, depths ≤ `MAX_STACK_DEPTH`, known key).
    pub fn layout(&self) -> Option<Layout> {
        let pow2 = |n: u32| n.is_power_of_two() && (MIN_SLOTS..=MAX_SLOTS).contains(&n);
        if !matches!(self.key, KEY_IP | KEY_PID_IP | KEY_STACK)
            || !pow2(self.slots)
            || self.probe == 0
            || self.probe > self.slots
            || self.kdepth as usize > MAX_STACK_DEPTH
            || self.udepth as usize > MAX_STACK_DEPTH
        {
            return None;
        }
        let stacks = self.key == KEY_STACK;
        if stacks != (self.stack_slots != 0) || (stacks && !pow2(self.stack_slots)) {
            return None;
        }
        let scratch = if stacks {
            8 * (self.max_depth() as u64 + 1)
        } else {
            0
        };
        let private_size = (PRIV_WORDS * 8) as u64 + scratch;
        let data_offset = (PRIV_OFFSET as u64 + private_size).checked_next_multiple_of(64)?;
        let stack_entry = if stacks {
            STACK_ENTRY_FIXED as u64 + 8 * self.max_depth().max(1) as u64
        } else {
            0
        };
        let table_bytes = (TABLE_HEADER_SIZE as u64)
            .checked_add(u64::from(self.slots) * SLOT_SIZE as u64)?
            .checked_add(u64::from(self.stack_slots).checked_mul(stack_entry)?)?
            .checked_next_multiple_of(64)?;
        let data_size = (TABLES_OFFSET as u64).checked_add(table_bytes.checked_mul(2)?)?;
        let buf_size = data_offset.checked_add(data_size)?;
        // The kernel maps this with vmalloc; keep a table under 1 GiB.
        if table_bytes > 1 << 30 {
            return None;
        }
        Some(Layout {
            private_size,
            data_offset,
            data_size,
            table0: data_offset + TABLES_OFFSET as u64,
            table_bytes,
            stack_entry,
            buf_size,
        })
    }
}
