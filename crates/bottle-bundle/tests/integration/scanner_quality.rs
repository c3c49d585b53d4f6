//! The secret scanner's precision and recall, held to a bar: over
//! credentials generated from their published shapes (bottle-test-
//! support's `secret_corpus`), placed in bodies, headers, paths and queries,
//! at least [`MIN_RECALL_PERCENT`] must be refused, no format may go
//! entirely undetected unless [`KNOWN_UNDETECTABLE`] says why, and no
//! generated benign request (package managers, digests, cookies, ids,
//! uploads, model calls, lockfiles, this repository's `Cargo.lock`) may
//! be refused.
//!
//! Requests are scanned as the proxy scans them, by the code the scanner
//! bench uses (`benches/scanner/like_proxy.rs`); `cargo bench -p
//! bottle-bundle --bench scanner` prints the full measurement, with the
//! registry's sources in the benign corpus. This test is a small subset,
//! fast in a debug build.

use bottle_test_support::secret_corpus::{Measurement, Rng, benign, secret_corpus};

use crate::like_proxy::LikeProxy;

/// The bench's seed: the test's corpus is a subset of the bench's.
const SEED: u64 = 24;
/// Samples per format (each placed six ways).
const SAMPLES: usize = 2;
/// Generated benign requests per generator.
const PER_GENERATOR: usize = 3;
/// Plain bodies are fed whole, and in frames just over the hold-back
/// window and small enough to split every token.
const CHUNKS: &[usize] = &[usize::MAX, 61, 7];

/// Overall recall must reach this.
const MIN_RECALL_PERCENT: f64 = 95.0;

/// Formats allowed to go undetected in every placement, each with why no
/// scanner of request bytes could be asked to find it. A format belongs
/// here only if it has no distinctive shape at all (no prefix, no
/// structure, no entropy over what a digest or id has); every format the
/// corpus generates today has one, so the list is empty.
const KNOWN_UNDETECTABLE: &[(&str, &str)] = &[];

#[test]
fn the_scanner_finds_published_credential_shapes_and_passes_benign_traffic() {
    let proxy = LikeProxy::new().unwrap();
    let mut m = Measurement::new();
    for case in secret_corpus(SEED, SAMPLES).unwrap() {
        let verdict = proxy.scan(&case.request, CHUNKS).unwrap();
        m.record_secret(&case, &verdict);
    }
    let mut cases = benign::generated_traffic(SEED, PER_GENERATOR).unwrap();
    let lockfile = concat!(env!("CARGO_MANIFEST_DIR"), "/../../Cargo.lock");
    let text = std::fs::read_to_string(lockfile).unwrap();
    cases.push(benign::BenignCase {
        source: "Cargo.lock".into(),
        fixture: None,
        request: benign::file_request(&mut Rng::new(SEED, "file/Cargo.lock"), "Cargo.lock", &text),
    });
    for case in &cases {
        let verdict = proxy.scan(&case.request, CHUNKS).unwrap();
        m.record_benign(case, &verdict);
    }

    let mut failures = Vec::new();
    let recall = m.recall();
    if recall.percent() < MIN_RECALL_PERCENT {
        failures.push(format!(
            "overall recall {} ({:.1}%) is under {MIN_RECALL_PERCENT}%",
            recall.ratio(),
            recall.percent()
        ));
    }
    for (format, tally) in m.format_recall() {
        let excused = KNOWN_UNDETECTABLE
            .iter()
            .any(|(name, _)| *name == format.name);
        if tally.found == 0 && !excused {
            failures.push(format!(
                "{} ({}) is never detected",
                format.name, format.source
            ));
        }
    }
    let flagged = m.benign_flagged();
    if flagged.found > 0 {
        failures.push(format!(
            "{} of {} benign requests are refused",
            flagged.found, flagged.total
        ));
    }
    assert!(
        failures.is_empty(),
        "{}\n\n{}",
        failures.join("\n"),
        m.render()
    );
}
