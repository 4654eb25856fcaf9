//! Hands the memory the allocator holds free back to the system, and reports the heap as the allocator
//! counts it. glibc's malloc keeps what a burst freed (a fleet's Packages unpacked and rendered, a
//! rollout's status writes) inside its arenas, between chunks still in use, so the process's RSS stays
//! at its peak: 38 MiB above the live heap once 500 HostedClusters have their Packages (docs/scale.md).
//! Every [`TRIM_EVERY`], when more than [`TRIM_ABOVE`] was freed since the last trim ([`TrimRule`]),
//! `malloc_trim` returns the free pages; it walks the arenas under their locks, so it runs on a blocking
//! thread, never on an actor's.
//!
//! Owns that and nothing else: it frees nothing itself and decides nothing about what the process keeps.
//! Only glibc has these calls; with another C library the loop does not run and no heap is reported.

use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use tracing::debug;

/// How often the heap is counted, and trimmed when worth it.
pub const TRIM_EVERY: Duration = Duration::from_secs(30);

/// Free bytes the allocator may have gained since the last trim before another is worth its walk over
/// the arenas.
pub const TRIM_ABOVE: u64 = 16 << 20;

/// The heap as the allocator counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeapCount {
    /// Allocated and not freed (mapped blocks included).
    pub in_use: u64,
    /// Freed, and still held by the allocator.
    pub free: u64,
}

/// When a trim is worth it. A trim leaves the free memory counted as free (its pages are handed back,
/// the chunks stay), so the count alone would ask for a trim every time: what counts is the free memory
/// gained since the lowest count after the last trim, which was freed (or reused and freed again) since,
/// and so is resident.
#[derive(Debug, Clone, Default)]
pub struct TrimRule {
    /// The least free memory counted since the last trim (0 before the first).
    low: u64,
}

impl TrimRule {
    /// Takes `count` in; true when more than [`TRIM_ABOVE`] was freed since the low point.
    pub fn worth_trimming(&mut self, count: HeapCount) -> bool {
        self.low = self.low.min(count.free);
        count.free - self.low > TRIM_ABOVE
    }

    /// A trim ran at `count`: its free memory is no longer resident.
    pub fn trimmed(&mut self, count: HeapCount) {
        self.low = count.free;
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct StateLabels {
    state: &'static str,
}

/// The heap's metrics; cheap to clone.
#[derive(Clone)]
pub struct HeapMetrics {
    bytes: Family<StateLabels, Gauge>,
    trims: Counter,
    trim_seconds: Histogram,
    released: Counter,
}

impl Default for HeapMetrics {
    fn default() -> Self {
        Self {
            bytes: Family::default(),
            trims: Counter::default(),
            // 100 µs .. ~3 s.
            trim_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 15)),
            released: Counter::default(),
        }
    }
}

impl HeapMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "pko_heap_bytes",
            "The heap as the allocator counts it: `in_use` (allocated, not freed) and `free` (freed, \
             still held by the allocator, counted in the process's RSS until trimmed).",
            self.bytes.clone(),
        );
        registry.register(
            "pko_heap_trims",
            "Times the allocator's free memory was handed back to the system.",
            self.trims.clone(),
        );
        registry.register(
            "pko_heap_trim_duration_seconds",
            "How long a trim took (it holds the allocator's locks meanwhile).",
            self.trim_seconds.clone(),
        );
        registry.register(
            "pko_heap_trim_released_bytes",
            "Resident memory the trims handed back to the system.",
            self.released.clone(),
        );
    }

    fn counted(&self, count: HeapCount) {
        for (state, bytes) in [("in_use", count.in_use), ("free", count.free)] {
            self.bytes
                .get_or_create(&StateLabels { state })
                .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
    }

    fn trimmed(&self, took: Duration, released: u64) {
        self.trims.inc();
        self.trim_seconds.observe(took.as_secs_f64());
        self.released.inc_by(released);
    }
}

/// Counts the heap every [`TRIM_EVERY`] and trims it when the [`TrimRule`] says so; runs until the
/// process ends.
pub async fn keep_trimmed(metrics: HeapMetrics) {
    let mut rule = TrimRule::default();
    let mut every = tokio::time::interval(TRIM_EVERY);
    loop {
        every.tick().await;
        let Some(count) = count_heap() else {
            return;
        };
        metrics.counted(count);
        if rule.worth_trimming(count) {
            if let Ok(trim) = tokio::task::spawn_blocking(trim_heap).await {
                debug!(took = ?trim.took, released = trim.released, free = count.free, "heap trimmed");
                metrics.trimmed(trim.took, trim.released);
                rule.trimmed(count);
            }
        }
    }
}

/// What one trim did.
#[derive(Debug, Clone, Copy)]
pub struct Trim {
    pub took: Duration,
    /// Resident memory handed back (0 when it could not be read).
    pub released: u64,
}

/// Hands the allocator's free pages back to the system; blocks while it walks the arenas.
pub fn trim_heap() -> Trim {
    let (before, started) = (resident_bytes(), Instant::now());
    allocator_trim();
    let took = started.elapsed();
    let released = before
        .zip(resident_bytes())
        .map_or(0, |(before, after)| before.saturating_sub(after));
    Trim { took, released }
}

/// The process's resident memory, from `/proc/self/statm` (in pages of 4 KiB on the platforms pko
/// runs on).
pub fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// The heap as glibc counts it.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
pub fn count_heap() -> Option<HeapCount> {
    // SAFETY: mallinfo2 takes no arguments and only reads the allocator's counters (glibc ≥ 2.33).
    let info = unsafe { libc::mallinfo2() };
    let as_u64 = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
    Some(HeapCount {
        in_use: as_u64(info.uordblks).saturating_add(as_u64(info.hblkhd)),
        free: as_u64(info.fordblks),
    })
}

/// Returns the free pages of every arena to the system.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn allocator_trim() {
    // SAFETY: malloc_trim takes a byte count to keep at the top of the heap and touches only the
    // allocator's own state, under its locks.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Another C library: no count, so [`keep_trimmed`] ends at its first look.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn count_heap() -> Option<HeapCount> {
    None
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn allocator_trim() {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trim_is_worth_it_only_for_memory_freed_since_the_last() {
        let count = |free| HeapCount {
            in_use: 100 << 20,
            free,
        };
        let mut rule = TrimRule::default();
        assert!(!rule.worth_trimming(count(TRIM_ABOVE)));
        assert!(rule.worth_trimming(count(40 << 20)));
        rule.trimmed(count(40 << 20));
        // Still 40 MiB free, handed back already: nothing to do.
        assert!(!rule.worth_trimming(count(40 << 20)));
        // 30 MiB reused, then freed again: resident again.
        assert!(!rule.worth_trimming(count(10 << 20)));
        assert!(rule.worth_trimming(count(40 << 20)));
        rule.trimmed(count(40 << 20));
        assert!(!rule.worth_trimming(count((40 << 20) + TRIM_ABOVE)));
        assert!(rule.worth_trimming(count((40 << 20) + TRIM_ABOVE + 1)));
    }

    #[test]
    fn the_metrics_report_the_count_and_the_trims() {
        let metrics = HeapMetrics::default();
        metrics.counted(HeapCount {
            in_use: 7 << 20,
            free: 3 << 20,
        });
        metrics.trimmed(Duration::from_millis(3), 2 << 20);
        metrics.trimmed(Duration::from_millis(4), 1 << 20);
        let text = crate::runtime::runtime_metrics::encoded(|r| metrics.register(r));
        for line in [
            r#"pko_heap_bytes{state="in_use"} 7340032"#,
            r#"pko_heap_bytes{state="free"} 3145728"#,
            "pko_heap_trims_total 2",
            "pko_heap_trim_released_bytes_total 3145728",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
    }
}
