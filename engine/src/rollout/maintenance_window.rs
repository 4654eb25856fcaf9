//! The arithmetic of maintenance windows: a window is open from every start its cron schedule names (in
//! its time zone) for its duration; starts may overlap, and a set of windows is open while any is.
//! What is measured: whether a set is open at an instant, when it opens or changes next, and how long it
//! was open between two instants (what progress deadlines and soaks count).
//!
//! Pure: no clock (every instant is given), no I/O; time-zone data is jiff's bundled database, so every
//! machine reads a window alike. Which window a HostedCluster is in is `engine::rollout::rollout_calendar`'s.

use std::str::FromStr;
use std::time::Duration;

use jiff::tz::TimeZone;
use jiff::{SignedDuration, Timestamp};
use jiff_cron::Schedule;
use pko_proto::core::rollout_calendar::HostedClusterPackageMaintenanceWindow;

use crate::api_time::elapsed;
use crate::rollout::rollout_policy::duration;

/// Starts walked per question at most: a schedule that fires every second over a month would otherwise
/// make one decision walk millions. Past it the rest of the span counts as open (see [`open_time`]).
pub const MAX_STARTS: usize = 10_000;

/// One checked maintenance window.
#[derive(Debug, Clone)]
pub struct MaintenanceWindow {
    pub name: String,
    schedule: Schedule,
    /// The schedule as written, for equality and messages.
    schedule_text: String,
    pub duration: Duration,
    time_zone: TimeZone,
    time_zone_name: String,
}

impl PartialEq for MaintenanceWindow {
    fn eq(&self, other: &Self) -> bool {
        (
            &self.name,
            &self.schedule_text,
            self.duration,
            &self.time_zone_name,
        ) == (
            &other.name,
            &other.schedule_text,
            other.duration,
            &other.time_zone_name,
        )
    }
}

/// An open stretch `[start, end)`.
pub type Interval = (Timestamp, Timestamp);

impl MaintenanceWindow {
    /// Checks one window of the policy; errors name the field (`field` is the window's path).
    pub fn parse(
        spec: &HostedClusterPackageMaintenanceWindow,
        field: &str,
    ) -> Result<Self, String> {
        if spec.name.is_empty() {
            return Err(format!("{field}.name: must not be empty"));
        }
        let schedule = cron_schedule(&spec.schedule)
            .map_err(|why| format!("{field}.schedule: {why}, got {:?}", spec.schedule))?;
        let field_duration = format!("{field}.duration");
        let duration = match duration(Some(&spec.duration), &field_duration)? {
            Some(d) if !d.is_zero() => d,
            _ => return Err(format!("{field_duration}: must be more than 0")),
        };
        let time_zone_name = match spec.time_zone.as_str() {
            "" => "UTC".to_owned(),
            name => name.to_owned(),
        };
        let time_zone = TimeZone::get(&time_zone_name).map_err(|_| {
            format!(
                "{field}.timeZone: not an IANA time zone such as Europe/Berlin, got {:?}",
                spec.time_zone
            )
        })?;
        Ok(Self {
            name: spec.name.clone(),
            schedule,
            schedule_text: spec.schedule.clone(),
            duration,
            time_zone,
            time_zone_name,
        })
    }

    fn span(&self) -> SignedDuration {
        SignedDuration::try_from(self.duration).unwrap_or(SignedDuration::MAX)
    }

    /// The window's open stretches that overlap `[from, to]` (an instant when `from == to`), clipped to
    /// it, in start order, at most [`MAX_STARTS`] of them; `true` when the walk stopped there.
    fn stretches(&self, from: Timestamp, to: Timestamp) -> (Vec<Interval>, bool) {
        let span = self.span();
        // A start before `from - duration` closed before `from`.
        let Ok(walk_from) = from.checked_sub(span) else {
            return (Vec::new(), false);
        };
        let mut out = Vec::new();
        for start in self.starts(walk_from) {
            if start > to {
                return (out, false);
            }
            if out.len() == MAX_STARTS {
                return (out, true);
            }
            let end = start.checked_add(span).unwrap_or(Timestamp::MAX);
            out.push((start.max(from), end.min(to).max(start.max(from))));
            if end > to && start <= from {
                // Open over the whole span already.
                return (out, false);
            }
        }
        (out, false)
    }

    /// Whether the window is open at `at`, and until when it stays open (the end of the stretch of
    /// overlapping starts it is in).
    pub fn open_until(&self, at: Timestamp) -> Option<Timestamp> {
        let span = self.span();
        let walk_from = at.checked_sub(span).ok()?;
        let mut until: Option<Timestamp> = None;
        for (walked, start) in self.starts(walk_from).enumerate() {
            let reaches = until.unwrap_or(at);
            if start > reaches || walked == MAX_STARTS {
                break;
            }
            let end = start.checked_add(span).unwrap_or(Timestamp::MAX);
            if end > at {
                until = Some(until.map_or(end, |u| u.max(end)));
            }
        }
        until
    }

    /// The first start after `at`.
    pub fn next_start(&self, at: Timestamp) -> Option<Timestamp> {
        self.starts(at).next()
    }

    /// The starts after `after`, in order. The schedule is walked on the local wall clock (as UTC, which
    /// has no gaps or folds) and each local start is then placed in the time zone: one in a spring gap
    /// moves forward by the gap, one in an autumn fold takes its first occurrence. (Walking the zoned
    /// clock directly skips a start that falls in a gap on some schedules.)
    fn starts(&self, after: Timestamp) -> impl Iterator<Item = Timestamp> + '_ {
        let local = after.to_zoned(self.time_zone.clone()).datetime();
        let walk = local
            .to_zoned(TimeZone::UTC)
            .unwrap_or_else(|_| after.to_zoned(TimeZone::UTC));
        self.schedule
            .after(walk)
            .filter_map(|start| self.time_zone.to_zoned(start.datetime()).ok())
            .map(|start| start.timestamp())
            .filter(move |start| *start > after)
    }
}

/// The schedule of a five- or six-field cron expression (jiff-cron reads six or seven, seconds first).
fn cron_schedule(text: &str) -> Result<Schedule, String> {
    let fields: Vec<&str> = text.split_whitespace().collect();
    let with_seconds = match fields.len() {
        5 => format!("0 {}", fields.join(" ")),
        6 => fields.join(" "),
        n => {
            return Err(format!(
                "want 5 fields (or 6 with seconds first), found {n}"
            ))
        }
    };
    if fields
        .last()
        .is_some_and(|dow| dow.chars().any(|c| c.is_ascii_digit()))
    {
        return Err("write the day of week by name (Sat, Mon-Fri): numbers mean different days in different cron dialects".to_owned());
    }
    Schedule::from_str(&with_seconds).map_err(|e| {
        let detail = e.to_string();
        format!(
            "not a cron schedule ({})",
            detail.lines().next().unwrap_or("")
        )
    })
}

/// The union of `windows`' open stretches within `[from, to]`, merged, and whether some walk stopped
/// at [`MAX_STARTS`] (the span after its last start then counts as open).
fn merged(windows: &[&MaintenanceWindow], from: Timestamp, to: Timestamp) -> Vec<Interval> {
    let mut all = Vec::new();
    for w in windows {
        let (mut stretches, capped) = w.stretches(from, to);
        if capped {
            if let Some(&(last, _)) = stretches.last() {
                stretches.push((last, to));
            }
        }
        all.extend(stretches);
    }
    all.sort();
    let mut out: Vec<Interval> = Vec::with_capacity(all.len());
    for (start, end) in all {
        match out.last_mut() {
            Some((_, last_end)) if start <= *last_end => *last_end = (*last_end).max(end),
            _ => out.push((start, end)),
        }
    }
    out
}

/// How long any of `windows` was open within `[from, to]`. No windows: always open, the whole span.
pub fn open_time(windows: &[&MaintenanceWindow], from: Timestamp, to: Timestamp) -> Duration {
    if to <= from || windows.is_empty() {
        return elapsed(from, to);
    }
    merged(windows, from, to)
        .into_iter()
        .map(|(start, end)| elapsed(start, end))
        .sum()
}

/// The first instant after `at` at which whether any of `windows` is open changes: the end of the
/// current stretch while one is open, else the next start.
pub fn next_change(windows: &[&MaintenanceWindow], at: Timestamp) -> Option<Timestamp> {
    let open_until = windows.iter().filter_map(|w| w.open_until(at)).max();
    match open_until {
        Some(until) => {
            // Another window may open before this one closes and carry the set on.
            let mut until = until;
            for _ in 0..windows.len() {
                match windows.iter().filter_map(|w| w.open_until(until)).max() {
                    Some(later) if later > until => until = later,
                    _ => break,
                }
            }
            Some(until)
        }
        None => windows.iter().filter_map(|w| w.next_start(at)).min(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    fn window(schedule: &str, duration: &str, tz: &str) -> MaintenanceWindow {
        MaintenanceWindow::parse(
            &HostedClusterPackageMaintenanceWindow {
                name: "w".into(),
                schedule: schedule.into(),
                duration: duration.into(),
                time_zone: tz.into(),
            },
            "spec.rolloutPolicy.maintenanceWindows[0]",
        )
        .unwrap()
    }

    fn ts(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    fn open_between(w: &MaintenanceWindow, from: &str, to: &str) -> Duration {
        open_time(&[w], ts(from), ts(to))
    }

    #[test]
    fn a_window_is_open_from_its_start_for_its_duration() {
        let w = window("0 2 * * Sat", "4h", "UTC");
        // 2026-11-28 is a Saturday.
        assert_eq!(w.open_until(ts("2026-11-28T01:59:59Z")), None);
        assert_eq!(
            w.open_until(ts("2026-11-28T02:00:00Z")),
            Some(ts("2026-11-28T06:00:00Z"))
        );
        assert_eq!(
            w.open_until(ts("2026-11-28T06:00:00Z")),
            None,
            "closes at its end"
        );
        assert_eq!(
            w.next_start(ts("2026-11-28T06:00:00Z")),
            Some(ts("2026-12-05T02:00:00Z"))
        );
    }

    #[test]
    fn a_window_across_midnight_stays_open_into_the_next_day() {
        let w = window("0 22 * * Fri", "4h", "UTC");
        // Friday 2026-11-27 22:00 to Saturday 02:00.
        assert_eq!(
            w.open_until(ts("2026-11-28T01:30:00Z")),
            Some(ts("2026-11-28T02:00:00Z"))
        );
        assert_eq!(
            open_between(&w, "2026-11-27T00:00:00Z", "2026-11-29T00:00:00Z"),
            Duration::from_secs(4 * 3600)
        );
    }

    #[test]
    fn daylight_saving_changes_shift_the_utc_time_and_not_the_local_one() {
        // Europe/Berlin leaves summer time on 2026-10-25 (03:00 CEST -> 02:00 CET).
        let w = window("30 1 * * Sun", "2h", "Europe/Berlin");
        assert_eq!(
            w.next_start(ts("2026-10-17T00:00:00Z")),
            Some(ts("2026-10-17T23:30:00Z")),
            "01:30 CEST is 23:30 UTC"
        );
        assert_eq!(
            w.next_start(ts("2026-10-24T00:00:00Z")),
            Some(ts("2026-10-24T23:30:00Z"))
        );
        assert_eq!(
            w.next_start(ts("2026-10-26T00:00:00Z")),
            Some(ts("2026-11-01T00:30:00Z")),
            "01:30 CET is 00:30 UTC"
        );
        // Across the change the window still lasts 2 hours of real time.
        assert_eq!(
            open_between(&w, "2026-10-24T12:00:00Z", "2026-10-25T12:00:00Z"),
            Duration::from_secs(2 * 3600)
        );
    }

    #[test]
    fn a_start_in_the_spring_gap_opens_an_hour_later_and_one_in_the_autumn_fold_once() {
        // 02:30 does not exist in Berlin on 2026-03-29 and exists twice on 2026-10-25.
        let w = window("30 2 * * *", "1h", "Europe/Berlin");
        assert_eq!(
            w.next_start(ts("2026-03-28T23:00:00Z")),
            Some(ts("2026-03-29T01:30:00Z")),
            "03:30 CEST"
        );
        let day = open_between(&w, "2026-10-24T22:00:00Z", "2026-10-25T22:00:00Z");
        assert_eq!(
            day,
            Duration::from_secs(3600),
            "opened once, at the first 02:30"
        );
        assert_eq!(
            w.next_start(ts("2026-10-24T22:00:00Z")),
            Some(ts("2026-10-25T00:30:00Z")),
            "02:30 CEST"
        );
    }

    #[test]
    fn overlapping_windows_count_their_union_once() {
        let a = window("0 1 * * *", "3h", "UTC");
        let b = window("0 3 * * *", "3h", "UTC");
        let day = (ts("2026-11-28T00:00:00Z"), ts("2026-11-29T00:00:00Z"));
        assert_eq!(
            open_time(&[&a, &b], day.0, day.1),
            Duration::from_secs(5 * 3600)
        );
        assert_eq!(
            next_change(&[&a, &b], ts("2026-11-28T02:00:00Z")),
            Some(ts("2026-11-28T06:00:00Z")),
            "b carries the set on past a's end"
        );
        // A window whose starts overlap each other (every hour, open 90 minutes) never closes.
        let c = window("0 * * * *", "90m", "UTC");
        assert_eq!(
            open_time(&[&c], day.0, day.1),
            Duration::from_secs(24 * 3600)
        );
    }

    #[test]
    fn seconds_schedules_serve_short_windows() {
        let w = window("*/20 * * * * *", "5s", "");
        assert_eq!(
            open_between(&w, "2026-11-28T00:00:00Z", "2026-11-28T00:01:00Z"),
            Duration::from_secs(15)
        );
        assert_eq!(
            next_change(&[&w], ts("2026-11-28T00:00:03Z")),
            Some(ts("2026-11-28T00:00:05Z"))
        );
        assert_eq!(
            next_change(&[&w], ts("2026-11-28T00:00:05Z")),
            Some(ts("2026-11-28T00:00:20Z"))
        );
    }

    #[test]
    fn a_walk_past_its_bound_counts_the_rest_as_open() {
        let w = window("* * * * * *", "1s", "UTC");
        let from = ts("2026-11-28T00:00:00Z");
        let to = ts("2026-11-30T00:00:00Z");
        assert_eq!(open_time(&[&w], from, to), Duration::from_secs(2 * 86_400));
    }

    #[test]
    fn invalid_windows_name_the_field() {
        let at = "spec.rolloutPolicy.maintenanceWindows[0]";
        let parse = |schedule: &str, duration: &str, tz: &str| {
            MaintenanceWindow::parse(
                &HostedClusterPackageMaintenanceWindow {
                    name: "w".into(),
                    schedule: schedule.into(),
                    duration: duration.into(),
                    time_zone: tz.into(),
                },
                at,
            )
            .unwrap_err()
        };
        assert_eq!(
            parse("0 2 * * 6", "4h", ""),
            format!("{at}.schedule: write the day of week by name (Sat, Mon-Fri): numbers mean different days in different cron dialects, got \"0 2 * * 6\"")
        );
        assert_eq!(
            parse("0 2 * *", "4h", ""),
            format!(
                "{at}.schedule: want 5 fields (or 6 with seconds first), found 4, got \"0 2 * *\""
            )
        );
        assert!(parse("0 25 * * *", "4h", "")
            .starts_with(&format!("{at}.schedule: not a cron schedule")));
        assert_eq!(
            parse("0 2 * * *", "0", ""),
            format!("{at}.duration: must be more than 0")
        );
        assert_eq!(
            parse("0 2 * * *", "4 hours", ""),
            format!("{at}.duration: want a duration such as 90s, 10m or 1h30m, got \"4 hours\"")
        );
        assert_eq!(
            parse("0 2 * * *", "4h", "Mars/Olympus"),
            format!(
                "{at}.timeZone: not an IANA time zone such as Europe/Berlin, got \"Mars/Olympus\""
            )
        );
    }

    proptest! {
        /// Open time is additive over a split, never exceeds the span, and a set is open at an instant
        /// exactly when the instant lies in one of its stretches.
        #[test]
        fn open_time_adds_up_over_any_split(
            start_min in 0u32..60, start_hour in 0u32..24, hours in 1u64..30,
            from_s in 0i64..(21 * 86_400), len_s in 0i64..(9 * 86_400), cut in 0.0f64..1.0,
            tz in prop::sample::select(vec!["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe"]),
        ) {
            let w = window(&format!("{start_min} {start_hour} * * Mon-Fri"), &format!("{hours}h"), tz);
            let base = ts("2026-03-01T00:00:00Z").as_second();
            let from = Timestamp::from_second(base + from_s).unwrap();
            let to = Timestamp::from_second(base + from_s + len_s).unwrap();
            let mid = Timestamp::from_second(base + from_s + (len_s as f64 * cut) as i64).unwrap();
            let whole = open_time(&[&w], from, to);
            prop_assert_eq!(whole, open_time(&[&w], from, mid) + open_time(&[&w], mid, to));
            prop_assert!(whole <= Duration::from_secs(len_s as u64));
            let open = w.open_until(mid).is_some();
            let around = open_time(&[&w], mid, Timestamp::from_second(mid.as_second() + 1).unwrap());
            prop_assert_eq!(open, around == Duration::from_secs(1));
        }

        /// The next change of a single window flips whether it is open.
        #[test]
        fn the_next_change_flips_openness(at_s in 0i64..(30 * 86_400), hours in 1u64..40) {
            let w = window("15 3 * * Tue,Sat", &format!("{hours}h"), "Europe/Berlin");
            let at = Timestamp::from_second(ts("2026-03-10T00:00:00Z").as_second() + at_s).unwrap();
            let change = next_change(&[&w], at).unwrap();
            prop_assert!(change > at);
            prop_assert_ne!(w.open_until(at).is_some(), w.open_until(change).is_some());
        }
    }
}
