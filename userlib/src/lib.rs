//! libhrperf (being written).
