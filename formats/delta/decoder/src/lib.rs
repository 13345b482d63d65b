//! delta decoder plugin (being written).
