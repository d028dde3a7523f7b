//! Sources: where data comes from. Each is built (validating config, opening handles, failing
//! loudly) and then run (a loop that never dies on one bad read).

pub mod nvml;
