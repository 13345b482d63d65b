//! Capture file writer and reader (being written).
