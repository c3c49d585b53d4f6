//! Where a launch's time goes: `bottle start --timings`.
//!
//! One [`Timeline`] is shared (it is a cheap handle) by the CLI, which
//! records its own phases, and the backend, which records each launch step
//! as it ends, the way progress lines are passed. A backend that talks to
//! a daemon counts its round trips into the same handle
//! ([`Timeline::count_round_trip`]), so every lap says how many it made.
//! The timeline only measures: it never changes what a launch does.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// One recorded lap: a phase or step and what it took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lap {
    /// The phase's or step's name (`prepare`, `bundle-create`, ...).
    pub name: String,
    /// Wall time since the previous lap ended (or the timeline began).
    pub took: Duration,
    /// Daemon round trips made during the lap.
    pub round_trips: u64,
}

#[derive(Debug)]
struct Laps {
    /// When the previous lap ended.
    last_end: Instant,
    /// The round-trip count when the previous lap ended.
    last_round_trips: u64,
    laps: Vec<Lap>,
}

/// A shared record of laps; clones record into the same timeline.
#[derive(Debug, Clone)]
pub struct Timeline {
    started: Instant,
    round_trips: Arc<AtomicU64>,
    laps: Arc<Mutex<Laps>>,
}

impl Default for Timeline {
    fn default() -> Timeline {
        Timeline::new()
    }
}

impl Timeline {
    /// A timeline whose first lap starts now.
    pub fn new() -> Timeline {
        let now = Instant::now();
        Timeline {
            started: now,
            round_trips: Arc::new(AtomicU64::new(0)),
            laps: Arc::new(Mutex::new(Laps {
                last_end: now,
                last_round_trips: 0,
                laps: Vec::new(),
            })),
        }
    }

    /// Counts one round trip to the daemon.
    pub fn count_round_trip(&self) {
        self.round_trips.fetch_add(1, Ordering::Relaxed);
    }

    /// Ends the current lap as `name`: the time and round trips since the
    /// previous lap.
    pub fn lap(&self, name: &str) {
        let now = Instant::now();
        let round_trips = self.round_trips.load(Ordering::Relaxed);
        // A panic elsewhere while holding the lock leaves laps that are
        // still well formed: keep recording.
        let mut laps = self.laps.lock().unwrap_or_else(PoisonError::into_inner);
        let took = now.saturating_duration_since(laps.last_end);
        let made = round_trips.saturating_sub(laps.last_round_trips);
        laps.last_end = now;
        laps.last_round_trips = round_trips;
        laps.laps.push(Lap {
            name: name.to_string(),
            took,
            round_trips: made,
        });
    }

    /// The laps so far, in order.
    pub fn laps(&self) -> Vec<Lap> {
        self.laps
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .laps
            .clone()
    }

    /// The laps as a table: one line per lap (name, milliseconds, round
    /// trips), then the total since the timeline began.
    pub fn render(&self) -> String {
        let laps = self.laps();
        let width = laps.iter().map(|l| l.name.len()).max().unwrap_or(0).max(5);
        let mut text = format!("{:<width$}  {:>9}  {:>11}\n", "step", "ms", "round trips");
        let mut round_trips = 0;
        for lap in &laps {
            round_trips += lap.round_trips;
            let _ = writeln!(
                text,
                "{:<width$}  {:>9.1}  {:>11}",
                lap.name,
                millis(lap.took),
                lap.round_trips
            );
        }
        let _ = writeln!(
            text,
            "{:<width$}  {:>9.1}  {:>11}",
            "total",
            millis(self.started.elapsed()),
            round_trips
        );
        text
    }
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_lap_counts_only_its_own_round_trips() {
        let timeline = Timeline::new();
        let backend = timeline.clone();
        backend.count_round_trip();
        backend.count_round_trip();
        timeline.lap("prepare");
        timeline.lap("load");
        backend.count_round_trip();
        backend.lap("network");
        let laps = timeline.laps();
        let counts: Vec<(&str, u64)> = laps
            .iter()
            .map(|l| (l.name.as_str(), l.round_trips))
            .collect();
        assert_eq!(counts, [("prepare", 2), ("load", 0), ("network", 1)]);
    }

    #[test]
    fn the_table_names_every_lap_and_the_total() {
        let timeline = Timeline::new();
        timeline.count_round_trip();
        timeline.lap("bundle-create");
        timeline.lap("complete");
        let text = timeline.render();
        let names: Vec<&str> = text
            .lines()
            .map(|l| l.split_whitespace().next().unwrap_or(""))
            .collect();
        assert_eq!(names, ["step", "bundle-create", "complete", "total"]);
        let total = text.lines().last().unwrap_or("");
        assert!(total.ends_with(" 1"), "{total}");
    }
}
