//! Decoder-plugin host (being written).
