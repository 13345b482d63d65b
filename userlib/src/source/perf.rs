//! The perf_event_open source (being written).
