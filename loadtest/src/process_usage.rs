//! What a process used so far, from /proc: CPU time and memory.

use std::time::Duration;

/// CPU time (user + system, all threads) and memory of a process, from /proc.
pub(crate) struct Usage {
    pub(crate) cpu: Duration,
    pub(crate) rss_kib: u64,
    pub(crate) peak_rss_kib: u64,
}

pub(crate) fn usage(pid: u32) -> Result<Usage, String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).map_err(|e| e.to_string())?;
    // Fields after the command (which may hold spaces) start at the state, field 3; utime and stime are
    // fields 14 and 15, in clock ticks.
    let after_command = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
    let fields: Vec<&str> = after_command.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let cpu_ticks = ticks(11) + ticks(12);
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|e| e.to_string())?;
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(key))
            .and_then(|value| value.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    Ok(Usage {
        cpu: Duration::from_millis(cpu_ticks * 1000 / clock_ticks_per_second()),
        rss_kib: kib("VmRSS:"),
        peak_rss_kib: kib("VmHWM:"),
    })
}

fn clock_ticks_per_second() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .filter(|&t| t > 0)
        .unwrap_or(100)
}
