//! This process's resident memory (Linux `/proc`), for the benchmarks' memory figures.

/// Peak and current resident memory of this process, in MiB, from `/proc/self/status` (Linux;
/// `None` elsewhere).
pub fn rss_mb() -> Option<(f64, f64)> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb = |key: &str| -> Option<f64> {
        let line = s.lines().find(|l| l.starts_with(key))?;
        line.split_whitespace().nth(1)?.parse::<f64>().ok()
    };
    Some((kb("VmHWM:")? / 1024.0, kb("VmRSS:")? / 1024.0))
}

/// Resets the peak-RSS mark to the current RSS (Linux `clear_refs` 5); false when not possible.
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}
