//! Secret scanner quality: recall over credentials generated from their
//! published shapes, false positives over realistic benign traffic.
//!
//! `cargo bench -p bottle-bundle --bench scanner` (add `-- --quick` for a
//! smaller corpus). Every request goes through the scanner as the proxy
//! runs it (`scanner/like_proxy.rs`); plain bodies are fed in several
//! frame sizes. The corpus comes from `bottle-test-support`'s
//! `secret_corpus`, which is built from published token shapes, never
//! from the scanner's own patterns. Benign traffic is generated (package
//! managers, digests, cookies, ids, uploads, model calls, lockfiles), plus
//! this repository's files and the sources of the crates its `Cargo.lock`
//! names, read from the local cargo registry (bounded).
//!
//! Prints a Markdown report: recall per format and per placement, overall
//! recall, every false positive, and the bytes scanned. It is a
//! measurement: low recall or false positives do not fail it; only a
//! harness error (a request the proxy could not have received, a corpus
//! that cannot be built) exits non-zero.

#![expect(clippy::print_stdout, reason = "a benchmark prints its report")]
#![expect(
    clippy::print_stderr,
    reason = "a benchmark says why its harness failed"
)]

#[path = "scanner/like_proxy.rs"]
mod like_proxy;

use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use bottle_test_support::secret_corpus::{
    FORMATS, FileBound, Measurement, Placement, benign, secret_corpus,
};
use like_proxy::LikeProxy;

/// The corpus's seed: every run measures the same requests.
const SEED: u64 = 24;

/// Frame sizes plain bodies are fed in: whole, a typical read, just over
/// the hold-back window, and small enough to split every token.
const CHUNKS: &[usize] = &[usize::MAX, 4096, 61, 7];

/// Frame sizes for file-backed bodies (megabytes of text): whole, a
/// typical read, and just over the hold-back window.
const FILE_CHUNKS: &[usize] = &[usize::MAX, 16 * 1024, 61];

fn main() -> ExitCode {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs this
    // binary too, without it, and must not scan a hundred megabytes in a
    // debug build.
    if !std::env::args().any(|a| a == "--bench") {
        println!(
            "scanner benchmark: skipped (run it with `cargo bench -p bottle-bundle --bench scanner`)"
        );
        return ExitCode::SUCCESS;
    }
    let quick = std::env::args().any(|a| a == "--quick");
    match run(quick) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("scanner bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(quick: bool) -> Result<(), String> {
    let started = Instant::now();
    let (samples, per_generator, bound) = if quick {
        (
            2,
            6,
            FileBound {
                files_per_crate: 2,
                max_file_bytes: 64 << 10,
                max_total_bytes: 4 << 20,
            },
        )
    } else {
        (
            6,
            25,
            FileBound {
                files_per_crate: 12,
                max_file_bytes: 256 << 10,
                max_total_bytes: 32 << 20,
            },
        )
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let proxy = LikeProxy::new()?;
    let mut m = Measurement::new();

    let secrets = secret_corpus(SEED, samples).map_err(|e| format!("secret corpus: {e}"))?;
    for case in &secrets {
        let verdict = proxy
            .scan(&case.request, CHUNKS)
            .map_err(|e| format!("{} in {}: {e}", case.format.name, case.placement.name()))?;
        m.record_secret(case, &verdict);
    }
    let secret_time = started.elapsed();

    let generated =
        benign::generated_traffic(SEED, per_generator).map_err(|e| format!("benign: {e}"))?;
    for case in &generated {
        let verdict = proxy
            .scan(&case.request, CHUNKS)
            .map_err(|e| format!("{}: {e}", case.source))?;
        m.record_benign(case, &verdict);
    }
    let workspace = benign::workspace_files(
        SEED,
        &root,
        &FileBound {
            files_per_crate: usize::MAX,
            ..bound
        },
    );
    let registry = benign::registry_sources(SEED, &root.join("Cargo.lock"), &bound);
    for corpus in [&workspace, &registry] {
        for case in &corpus.cases {
            let verdict = proxy
                .scan(&case.request, FILE_CHUNKS)
                .map_err(|e| format!("{}: {e}", case.source))?;
            m.record_benign(case, &verdict);
        }
        for skipped in &corpus.skipped {
            m.note(format!("not read: {skipped}"));
        }
    }
    let elapsed = started.elapsed();

    println!("## Secret scanner: recall and false positives\n");
    println!(
        "Seed {SEED}{}. Secrets: {} formats x {samples} samples x {} placements = {} requests; plain bodies fed whole and in frames of 4096, 61 and 7 bytes.",
        if quick { ", --quick" } else { "" },
        FORMATS.len(),
        Placement::ALL.len(),
        secrets.len()
    );
    println!(
        "Benign: {} generated requests ({per_generator} per generator, plus every carrier with a placeholder), {} workspace files ({} KiB), {} registry files ({} KiB, at most {} per crate); file bodies fed whole and in frames of 16 KiB and 61 bytes.\n",
        generated.len(),
        workspace.cases.len(),
        workspace.bytes >> 10,
        registry.cases.len(),
        registry.bytes >> 10,
        bound.files_per_crate
    );
    println!("{}", m.render());
    println!(
        "Runtime: {:.2} s ({:.2} s for the secret corpus), {} build.",
        elapsed.as_secs_f64(),
        secret_time.as_secs_f64(),
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "optimised"
        }
    );
    Ok(())
}
