//! The tally of what a scanner said about the corpus, and the report.
//!
//! A secret counts as found when its request would be refused whatever
//! the chunking of its body ([`Verdict::always_blocked`]): the network,
//! not the agent, decides where a body's frames split, so a secret found
//! under some chunkings only is a miss waiting to happen, and is listed
//! as such. A benign request counts as a false positive when it would be
//! refused under any chunking tried.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use super::benign::BenignCase;
use super::{FORMATS, Format, Placement, SecretCase};

/// Where a scanner flagged a request, and as what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flag {
    /// `target`, `header <name>`, `body`, `body (chunks of 7)`, ...
    pub location: String,
    /// The finding's kind (or, for a body that could not be scanned, the
    /// refusal's reason).
    pub kind: String,
}

impl Flag {
    /// A flag at `location` of `kind`.
    pub fn new(location: impl Into<String>, kind: impl Into<String>) -> Self {
        Flag {
            location: location.into(),
            kind: kind.into(),
        }
    }
}

/// What a scanner said about one request.
#[derive(Debug, Clone, Default)]
pub struct Verdict {
    /// Every flag raised, under any chunking of the body.
    pub flags: Vec<Flag>,
    /// Refused whatever the chunking of its body: flagged in the target or
    /// a header, or in the body under every chunking tried.
    pub always_blocked: bool,
    /// Bytes handed to the scanner for this request (a body once per
    /// chunking; an encoded body as sent and decoded).
    pub bytes_scanned: u64,
}

impl Verdict {
    /// Refused under at least one chunking.
    pub fn blocked(&self) -> bool {
        !self.flags.is_empty()
    }
}

/// Found out of total.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// How many were found.
    pub found: usize,
    /// How many there were.
    pub total: usize,
}

impl Tally {
    fn add(&mut self, found: bool) {
        self.total += 1;
        self.found += usize::from(found);
    }

    /// `found/total`.
    pub fn ratio(&self) -> String {
        format!("{}/{}", self.found, self.total)
    }

    /// The share found, in percent (100 for an empty tally).
    pub fn percent(&self) -> f64 {
        if self.total == 0 {
            return 100.0;
        }
        self.found as f64 * 100.0 / self.total as f64
    }
}

/// A benign request that was flagged.
#[derive(Debug, Clone)]
pub struct FalsePositive {
    /// The generator or file it came from.
    pub source: String,
    /// What flagged it.
    pub flag: Flag,
}

/// The tally over a whole run.
#[derive(Debug)]
pub struct Measurement {
    /// Per format (in [`FORMATS`] order), per placement.
    cells: Vec<[Tally; 6]>,
    /// Per format, the kinds it was found as.
    kinds: Vec<BTreeSet<String>>,
    /// Secrets found under some chunkings of the body only.
    chunk_dependent: Vec<String>,
    secret_bytes: u64,
    benign: Tally,
    benign_bytes: u64,
    false_positives: Vec<FalsePositive>,
    fixtures: Vec<(String, &'static str, Vec<Flag>)>,
    notes: Vec<String>,
}

impl Default for Measurement {
    fn default() -> Self {
        Self::new()
    }
}

impl Measurement {
    /// An empty tally.
    pub fn new() -> Self {
        Measurement {
            cells: vec![[Tally::default(); 6]; FORMATS.len()],
            kinds: vec![BTreeSet::new(); FORMATS.len()],
            chunk_dependent: Vec::new(),
            secret_bytes: 0,
            benign: Tally::default(),
            benign_bytes: 0,
            false_positives: Vec::new(),
            fixtures: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// Records what the scanner said about a secret.
    pub fn record_secret(&mut self, case: &SecretCase, verdict: &Verdict) {
        let Some(i) = FORMATS.iter().position(|f| f.name == case.format.name) else {
            self.notes
                .push(format!("unknown format {} skipped", case.format.name));
            return;
        };
        self.secret_bytes += verdict.bytes_scanned;
        self.cells[i][case.placement.index()].add(verdict.always_blocked);
        for flag in &verdict.flags {
            self.kinds[i].insert(flag.kind.clone());
        }
        if verdict.blocked() && !verdict.always_blocked {
            let flags: Vec<String> = verdict
                .flags
                .iter()
                .map(|f| format!("{} in {}", f.kind, f.location))
                .collect();
            self.chunk_dependent.push(format!(
                "{} #{} in {}: only {}",
                case.format.name,
                case.sample,
                case.placement.name(),
                flags.join(", ")
            ));
        }
    }

    /// Records what the scanner said about a benign request.
    pub fn record_benign(&mut self, case: &BenignCase, verdict: &Verdict) {
        self.benign_bytes += verdict.bytes_scanned;
        if let Some(why) = case.fixture {
            self.fixtures
                .push((case.source.clone(), why, verdict.flags.clone()));
            return;
        }
        self.benign.add(verdict.blocked());
        for flag in &verdict.flags {
            self.false_positives.push(FalsePositive {
                source: case.source.clone(),
                flag: flag.clone(),
            });
        }
    }

    /// Adds a line to the report's notes (files skipped, bounds reached).
    pub fn note(&mut self, note: impl Into<String>) {
        self.notes.push(note.into());
    }

    /// Recall over every secret.
    pub fn recall(&self) -> Tally {
        let mut all = Tally::default();
        for cell in self.cells.iter().flatten() {
            all.found += cell.found;
            all.total += cell.total;
        }
        all
    }

    /// Recall per format, in [`FORMATS`] order.
    pub fn format_recall(&self) -> Vec<(&'static Format, Tally)> {
        FORMATS
            .iter()
            .zip(&self.cells)
            .map(|(format, cells)| {
                let mut t = Tally::default();
                for c in cells {
                    t.found += c.found;
                    t.total += c.total;
                }
                (format, t)
            })
            .collect()
    }

    /// Recall per placement, in [`Placement::ALL`] order.
    pub fn placement_recall(&self) -> [Tally; 6] {
        let mut out = [Tally::default(); 6];
        for cells in &self.cells {
            for (o, c) in out.iter_mut().zip(cells) {
                o.found += c.found;
                o.total += c.total;
            }
        }
        out
    }

    /// Every flag raised on benign traffic outside the known fixtures.
    pub fn false_positives(&self) -> &[FalsePositive] {
        &self.false_positives
    }

    /// Benign requests flagged, out of those scanned (fixtures apart).
    pub fn benign_flagged(&self) -> Tally {
        self.benign
    }

    /// The report: recall per format and placement, overall recall, the
    /// secrets found only under some chunkings, every false positive, the
    /// fixtures' findings, notes, and the bytes scanned.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "### Recall per format\n\nA secret is found when its request is refused whatever its body's chunking.\n"
        );
        let mut head = String::from("| format |");
        let mut rule = String::from("|---|");
        for p in Placement::ALL {
            let _ = write!(head, " {} |", p.name());
            rule.push_str("---|");
        }
        let _ = writeln!(
            out,
            "{head} all | found as | shape published in |\n{rule}---|---|---|"
        );
        for ((format, total), (cells, kinds)) in self
            .format_recall()
            .into_iter()
            .zip(self.cells.iter().zip(&self.kinds))
        {
            let mut row = format!("| {} |", format.name);
            for c in cells {
                let _ = write!(row, " {} |", c.ratio());
            }
            let kinds: Vec<&str> = kinds.iter().map(String::as_str).collect();
            let _ = writeln!(
                out,
                "{row} {} ({:.0}%) | {} | {} |",
                total.ratio(),
                total.percent(),
                if kinds.is_empty() {
                    "-".to_string()
                } else {
                    kinds.join(", ")
                },
                format.source.replace('|', "\\|")
            );
        }
        let _ = writeln!(
            out,
            "\n### Recall per placement\n\n| placement | found | % |\n|---|---|---|"
        );
        for (p, t) in Placement::ALL.iter().zip(self.placement_recall()) {
            let _ = writeln!(out, "| {} | {} | {:.1} |", p.name(), t.ratio(), t.percent());
        }
        let all = self.recall();
        let zero: Vec<&str> = self
            .format_recall()
            .into_iter()
            .filter(|(_, t)| t.found == 0)
            .map(|(f, _)| f.name)
            .collect();
        let _ = writeln!(
            out,
            "\n**Overall recall: {} ({:.1}%)**; formats at 0%: {} ({})\n",
            all.ratio(),
            all.percent(),
            zero.len(),
            if zero.is_empty() {
                "none".to_string()
            } else {
                zero.join(", ")
            }
        );
        let _ = writeln!(
            out,
            "### Found under some chunkings only ({})\n",
            self.chunk_dependent.len()
        );
        for line in &self.chunk_dependent {
            let _ = writeln!(out, "- {line}");
        }
        let flagged = self.benign_flagged();
        let _ = writeln!(
            out,
            "\n### False positives: {} of {} benign requests flagged ({} flags)\n",
            flagged.found,
            flagged.total,
            self.false_positives.len()
        );
        if !self.false_positives.is_empty() {
            let mut by_kind: Vec<(String, usize)> = Vec::new();
            for fp in &self.false_positives {
                match by_kind.iter_mut().find(|(k, _)| *k == fp.flag.kind) {
                    Some((_, n)) => *n += 1,
                    None => by_kind.push((fp.flag.kind.clone(), 1)),
                }
            }
            let kinds: Vec<String> = by_kind.iter().map(|(k, n)| format!("{k}: {n}")).collect();
            let _ = writeln!(out, "By kind: {}\n", kinds.join(", "));
            let _ = writeln!(out, "| source | where | kind |\n|---|---|---|");
            for fp in &self.false_positives {
                let _ = writeln!(
                    out,
                    "| {} | {} | {} |",
                    fp.source, fp.flag.location, fp.flag.kind
                );
            }
        }
        let flagged_fixtures = self.fixtures.iter().filter(|f| !f.2.is_empty()).count();
        let _ = writeln!(
            out,
            "\n### Set apart: files that hold fake credentials on purpose ({} files, {} flagged; not counted above)\n",
            self.fixtures.len(),
            flagged_fixtures
        );
        for (source, why, flags) in &self.fixtures {
            let flags: Vec<String> = flags
                .iter()
                .map(|f| format!("{} in {}", f.kind, f.location))
                .collect();
            let _ = writeln!(
                out,
                "- {source} ({why}): {}",
                if flags.is_empty() {
                    "not flagged".to_string()
                } else {
                    flags.join(", ")
                }
            );
        }
        if !self.notes.is_empty() {
            let _ = writeln!(out, "\n### Notes\n");
            for note in &self.notes {
                let _ = writeln!(out, "- {note}");
            }
        }
        let _ = writeln!(
            out,
            "\nBytes scanned: {} in the secret corpus, {} in the benign corpus ({:.1} MiB in all).",
            self.secret_bytes,
            self.benign_bytes,
            (self.secret_bytes + self.benign_bytes) as f64 / f64::from(1u32 << 20)
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Request, secret_corpus};
    use super::*;

    #[test]
    fn found_means_found_under_every_chunking() {
        let cases = secret_corpus(1, 1).unwrap();
        let mut m = Measurement::new();
        let always = Verdict {
            flags: vec![Flag::new("body", "x")],
            always_blocked: true,
            bytes_scanned: 10,
        };
        let sometimes = Verdict {
            flags: vec![Flag::new("body (chunks of 7)", "x")],
            always_blocked: false,
            bytes_scanned: 10,
        };
        m.record_secret(&cases[0], &always);
        m.record_secret(&cases[1], &sometimes);
        m.record_secret(&cases[2], &Verdict::default());
        assert_eq!(m.recall(), Tally { found: 1, total: 3 });
        assert_eq!(m.chunk_dependent.len(), 1);
        let benign = BenignCase {
            source: "generator x #0".into(),
            fixture: None,
            request: Request::new("GET", "h", "/"),
        };
        m.record_benign(&benign, &sometimes);
        m.record_benign(&benign, &Verdict::default());
        assert_eq!(m.benign_flagged(), Tally { found: 1, total: 2 });
        assert_eq!(m.false_positives().len(), 1);
        let report = m.render();
        assert!(report.contains("Overall recall: 1/3"), "{report}");
    }
}
