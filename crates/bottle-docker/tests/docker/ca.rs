//! The bottle's CA installed the way each image's own tooling expects
//! (`bottle_core::ca_install`), on images built here from the demo image
//! (or from nothing) with the layouts of real distributions.

use std::collections::HashMap;

use bottle_core::exec::{CommandRunner, CommandSpec, SystemRunner};
use bottle_docker::client::Engine;
use bottle_docker::tarball::{Ownership, TarBuilder};

use bottle_test_support::DEBIAN_IMAGE_ENV;

use crate::support::{self, DEMO_TAG, Fixture, name, sh};

/// An image built for one test, removed when dropped.
struct TestImage {
    engine: Engine,
    tag: String,
}

impl Drop for TestImage {
    fn drop(&mut self) {
        let engine = &self.engine;
        let options = bollard::query_parameters::RemoveImageOptionsBuilder::default()
            .force(true)
            .build();
        let _ = engine.block_on(engine.docker.remove_image(&self.tag, Some(options), None));
    }
}

/// Builds `dockerfile` with `files` (name, contents, mode) as its context,
/// tagged `bottle-ca-test-<label>:test`, and points the fixture's manifest
/// at it.
fn build_image(
    fx: &mut Fixture,
    label: &str,
    dockerfile: &str,
    files: &[(&str, &[u8], u32)],
) -> TestImage {
    let mut context = TarBuilder::new();
    context
        .file("Dockerfile", dockerfile.as_bytes(), 0o644, Ownership::ROOT)
        .unwrap();
    for (path, contents, mode) in files {
        context
            .file(path, contents, *mode, Ownership::ROOT)
            .unwrap();
    }
    let tag = format!("bottle-ca-test-{label}:test");
    let engine = fx.backend.engine().unwrap();
    bottle_docker::images::build_from_tar(
        engine,
        context.finish().unwrap(),
        "Dockerfile",
        &tag,
        &HashMap::new(),
        &HashMap::new(),
        None,
    )
    .unwrap();
    fx.image = tag.clone();
    TestImage {
        engine: engine.clone(),
        tag,
    }
}

/// The demo image with `script` run as root on top.
fn demo_with(script: &str) -> String {
    format!("FROM {DEMO_TAG}\nUSER root\nRUN {script}\nUSER agent\n")
}

/// A file from the agent container, read as root through the archive API
/// (a symlink comes back as the link, not its target).
fn read_as_root(fx: &Fixture, bottle: &str, path: &str) -> String {
    let (contents, _, _) = support::download(&fx.backend, &format!("{bottle}-agent"), path);
    String::from_utf8(contents).unwrap()
}

/// A file as the agent reads it (through symlinks).
fn read_as_agent(bottle: &dyn bottle_core::Bottle, path: &str) -> String {
    let out = sh(bottle, &format!("cat {path}"));
    assert_eq!(
        out.exit_code,
        0,
        "cat {path}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The body of the bottle's CA, the way it appears in any bundle.
fn ca_of(bottle: &dyn bottle_core::Bottle) -> String {
    let ca = read_as_agent(bottle, "/etc/bottle/ca.pem");
    assert!(ca.starts_with("-----BEGIN CERTIFICATE-----"), "{ca}");
    ca
}

/// Runs a command in the agent container as root, as an agent whose image
/// lets it become root (sudo) would.
fn run_as_root(fx: &Fixture, bottle: &str, argv: &[&str]) -> bottle_core::ExecOutput {
    let engine = fx.backend.engine().unwrap();
    let argv: Vec<String> = argv.iter().map(|a| a.to_string()).collect();
    engine
        .block_on(bottle_docker::bottle::exec_captured(
            engine,
            &format!("{bottle}-agent"),
            &argv,
            Some("0:0"),
        ))
        .unwrap()
}

fn host_openssl(args: &[&str]) -> String {
    let out = SystemRunner
        .run(&CommandSpec::new("openssl").args(args.iter().copied()))
        .expect("run openssl on the host");
    assert!(out.success(), "openssl {args:?}: {}", out.stderr_text());
    out.stdout_text()
}

/// Arch's and Nix's shape: the bundle a TLS library opens is a link to
/// the extracted file; a second link dangles.
const LINKED_BUNDLES: &str = "mkdir -p /etc/ca-certificates/extracted && \
     printf 'ROOTS\\n' > /etc/ca-certificates/extracted/tls-ca-bundle.pem && \
     ln -s ../../ca-certificates/extracted/tls-ca-bundle.pem /etc/ssl/certs/ca-certificates.crt && \
     ln -s /nix/store/gone/ca-bundle.crt /etc/ssl/cert.pem";

#[test]
fn a_symlinked_bundle_gets_the_ca_in_its_target_and_the_hashed_dir_an_entry() {
    let Some(mut fx) =
        support::setup("a_symlinked_bundle_gets_the_ca_in_its_target_and_the_hashed_dir_an_entry")
    else {
        return;
    };
    let dockerfile = demo_with(LINKED_BUNDLES);
    let _image = build_image(&mut fx, "symlink", &dockerfile, &[]);
    let name = name("ca-link");
    let (_guard, bottle) = fx.start(&name);
    let bottle_name = format!("bot-bottle-{name}");
    let ca = ca_of(&*bottle);

    let target = read_as_root(
        &fx,
        &bottle_name,
        "/etc/ca-certificates/extracted/tls-ca-bundle.pem",
    );
    assert_eq!(target, format!("ROOTS\n{ca}"));
    // The link is still a link; reading through it finds the CA.
    let link = sh(&*bottle, "readlink /etc/ssl/certs/ca-certificates.crt");
    assert_eq!(
        String::from_utf8(link.stdout).unwrap(),
        "../../ca-certificates/extracted/tls-ca-bundle.pem\n"
    );
    assert!(read_as_agent(&*bottle, "/etc/ssl/certs/ca-certificates.crt").contains(&ca));

    // The dangling link is the one warning, naming where it points.
    let warnings = bottle.launch_warnings();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("/etc/ssl/cert.pem") && warnings[0].contains("/nix/store/gone"),
        "{warnings:?}"
    );

    // The hashed directory's entry has the name OpenSSL's lookup computes,
    // and a real `-CApath` lookup through a copy of it finds the CA.
    let scratch = tempfile::tempdir().unwrap();
    let ca_file = scratch.path().join("ca.pem");
    std::fs::write(&ca_file, &ca).unwrap();
    let ca_path = ca_file.to_str().unwrap();
    let hash = host_openssl(&["x509", "-noout", "-subject_hash", "-in", ca_path]);
    let entry = format!("{}.0", hash.trim());
    let held = read_as_root(&fx, &bottle_name, &format!("/etc/ssl/certs/{entry}"));
    assert_eq!(held, ca);
    let capath = scratch.path().join("capath");
    std::fs::create_dir(&capath).unwrap();
    std::fs::write(capath.join(&entry), held).unwrap();
    let verified = host_openssl(&[
        "verify",
        "-CApath",
        capath.to_str().unwrap(),
        "-no-CAfile",
        ca_path,
    ]);
    assert_eq!(verified.trim(), format!("{ca_path}: OK"));
}

#[test]
fn a_second_bottle_of_an_image_gets_its_own_ca_from_the_remembered_survey() {
    let Some(mut fx) =
        support::setup("a_second_bottle_of_an_image_gets_its_own_ca_from_the_remembered_survey")
    else {
        return;
    };
    let dockerfile = demo_with(LINKED_BUNDLES);
    let _image = build_image(&mut fx, "remembered", &dockerfile, &[]);
    let surveys = fx.state.path().join(bottle_docker::cache::CA_SURVEY_CACHE);
    let mut cas = Vec::new();
    for (i, remembered) in [(1, false), (2, true)] {
        assert_eq!(
            surveys.read_dir().is_ok_and(|mut d| d.next().is_some()),
            remembered,
            "bottle {i}: the survey is remembered after the first bottle only"
        );
        let name = name(&format!("ca-again-{i}"));
        let (_guard, bottle) = fx.start(&name);
        let bottle_name = format!("bot-bottle-{name}");
        let ca = ca_of(&*bottle);
        let target = read_as_root(
            &fx,
            &bottle_name,
            "/etc/ca-certificates/extracted/tls-ca-bundle.pem",
        );
        assert_eq!(target, format!("ROOTS\n{ca}"), "bottle {i}");
        let scratch = tempfile::tempdir().unwrap();
        let ca_file = scratch.path().join("ca.pem");
        std::fs::write(&ca_file, &ca).unwrap();
        let hash = host_openssl(&[
            "x509",
            "-noout",
            "-subject_hash",
            "-in",
            ca_file.to_str().unwrap(),
        ]);
        let entry = format!("/etc/ssl/certs/{}.0", hash.trim());
        assert_eq!(read_as_root(&fx, &bottle_name, &entry), ca, "bottle {i}");
        let warnings = bottle.launch_warnings();
        assert_eq!(warnings.len(), 1, "bottle {i}: {warnings:?}");
        assert!(warnings[0].contains("/nix/store/gone"), "{warnings:?}");
        cas.push(ca);
    }
    assert_ne!(cas[0], cas[1], "each bottle has a CA of its own");
}

#[test]
fn a_fedora_layout_gets_the_anchor_and_the_bundle() {
    let Some(mut fx) = support::setup("a_fedora_layout_gets_the_anchor_and_the_bundle") else {
        return;
    };
    let dockerfile = demo_with(
        "mkdir -p /etc/pki/tls/certs /etc/pki/ca-trust/source/anchors && \
         printf 'ROOTS\\n' > /etc/pki/tls/certs/ca-bundle.crt",
    );
    let _image = build_image(&mut fx, "fedora", &dockerfile, &[]);
    let name = name("ca-fedora");
    let (_guard, bottle) = fx.start(&name);
    let ca = ca_of(&*bottle);
    assert_eq!(
        read_as_agent(&*bottle, "/etc/pki/ca-trust/source/anchors/bottle.pem"),
        ca
    );
    assert_eq!(
        read_as_agent(&*bottle, "/etc/pki/tls/certs/ca-bundle.crt"),
        format!("ROOTS\n{ca}")
    );
    assert_eq!(bottle.launch_warnings(), [] as [String; 0]);
}

/// Debian's `update-ca-certificates` in miniature: the bundle is rebuilt
/// from the distribution's roots and the local anchors, so whatever was
/// appended to it by hand is gone.
const UPDATE_CA_CERTIFICATES: &str = "#!/bin/sh
set -e
for f in /usr/share/ca-certificates/*/*.crt /usr/local/share/ca-certificates/*.crt; do
    if [ -f \"$f\" ]; then cat \"$f\"; fi
done > /etc/ssl/certs/ca-certificates.crt.new
mv /etc/ssl/certs/ca-certificates.crt.new /etc/ssl/certs/ca-certificates.crt
echo rebuilt
";

/// A stand-in for a distribution root (only its PEM shape matters).
const DISTRIBUTION_ROOT: &str =
    "-----BEGIN CERTIFICATE-----\nUk9PVA==\n-----END CERTIFICATE-----\n";

#[test]
fn the_ca_survives_the_agent_running_update_ca_certificates_again() {
    let Some(mut fx) =
        support::setup("the_ca_survives_the_agent_running_update_ca_certificates_again")
    else {
        return;
    };
    let dockerfile = format!(
        "FROM {DEMO_TAG}\nUSER root\n\
         COPY update-ca-certificates /usr/sbin/update-ca-certificates\n\
         COPY root.crt /usr/share/ca-certificates/distribution/root.crt\n\
         RUN mkdir -p /usr/local/share/ca-certificates && /usr/sbin/update-ca-certificates\n\
         USER agent\n"
    );
    let _image = build_image(
        &mut fx,
        "debian-tool",
        &dockerfile,
        &[
            (
                "update-ca-certificates",
                UPDATE_CA_CERTIFICATES.as_bytes(),
                0o755,
            ),
            ("root.crt", DISTRIBUTION_ROOT.as_bytes(), 0o644),
        ],
    );
    let name = name("ca-tool");
    let (_guard, bottle) = fx.start(&name);
    let bottle_name = format!("bot-bottle-{name}");
    let ca = ca_of(&*bottle);
    assert_eq!(
        read_as_agent(&*bottle, "/usr/local/share/ca-certificates/bottle.crt"),
        ca
    );
    let expected = format!("{DISTRIBUTION_ROOT}{ca}");
    assert_eq!(
        read_as_agent(&*bottle, "/etc/ssl/certs/ca-certificates.crt"),
        expected,
        "the launch's own run of the tool put the CA in the bundle, once"
    );
    assert_eq!(bottle.launch_warnings(), [] as [String; 0]);

    let again = run_as_root(&fx, &bottle_name, &["/usr/sbin/update-ca-certificates"]);
    assert_eq!(
        (again.exit_code, again.stdout.as_slice()),
        (0, b"rebuilt\n".as_slice()),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    assert_eq!(
        read_as_agent(&*bottle, "/etc/ssl/certs/ca-certificates.crt"),
        expected
    );
}

/// The Debian test image's trust store as `update-ca-certificates` leaves
/// it: the bundle's digest, then every entry of the hashed directory with
/// its link target, sorted.
const TRUST_STORE: &str = "sha256sum /etc/ssl/certs/ca-certificates.crt && \
     find /etc/ssl/certs -mindepth 1 -printf '%f -> %l\\n' | LC_ALL=C sort";

/// Debian's own `update-ca-certificates` is not run at launch (its rehash
/// of every certificate is seconds on the critical path): its effect is
/// written from outside. The real script, run afterwards from scratch,
/// leaves exactly that trust store, and run as an agent would, changes
/// nothing; OpenSSL finds the CA by file and by hashed directory.
#[test]
fn debians_tool_is_written_from_outside_exactly_as_it_would_write() {
    let test = "debians_tool_is_written_from_outside_exactly_as_it_would_write";
    let Some(mut fx) = support::setup(test) else {
        return;
    };
    let Ok(image) = std::env::var(DEBIAN_IMAGE_ENV) else {
        bottle_test_support::skip_docker_test(
            test,
            format!("{DEBIAN_IMAGE_ENV} is not set (run `cargo xtask test`)"),
        );
        return;
    };
    fx.image = image;
    let name = name("ca-debian");
    let (_guard, bottle) = fx.start(&name);
    let bottle_name = format!("bot-bottle-{name}");
    assert_eq!(bottle.launch_warnings(), [] as [String; 0]);
    let ca = ca_of(&*bottle);
    let store = |what: &str| {
        let out = run_as_root(&fx, &bottle_name, &["/bin/sh", "-c", TRUST_STORE]);
        assert_eq!(
            out.exit_code,
            0,
            "{what}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    // The survey the launch remembered says the tool is written, not run.
    let surveys = fx.state.path().join(bottle_docker::cache::CA_SURVEY_CACHE);
    let remembered: Vec<String> = std::fs::read_dir(&surveys)
        .unwrap()
        .map(|entry| std::fs::read_to_string(entry.unwrap().path()).unwrap())
        .collect();
    assert!(
        remembered.len() == 1 && remembered[0].contains("\"tool_emulated\":true"),
        "{remembered:?}"
    );
    let written = store("as written");
    assert!(
        written.contains("bottle.pem -> /usr/local/share/ca-certificates/bottle.crt\n"),
        "{written}"
    );
    assert!(
        read_as_agent(&*bottle, "/etc/ssl/certs/ca-certificates.crt").ends_with(&ca),
        "the bundle ends with the CA"
    );
    // Each store alone: the agent's SSL_CERT_FILE (the CA file itself)
    // unset and OpenSSL's other defaults turned off.
    for store in [
        "-no-CAfile -no-CAstore -CApath /etc/ssl/certs",
        "-no-CApath -no-CAstore -CAfile /etc/ssl/certs/ca-certificates.crt",
    ] {
        let check = format!(
            "env -u SSL_CERT_FILE -u SSL_CERT_DIR openssl verify {store} /etc/bottle/ca.pem"
        );
        let out = sh(&*bottle, &check);
        assert_eq!(
            out.exit_code,
            0,
            "{check}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    let again = run_as_root(&fx, &bottle_name, &["/usr/sbin/update-ca-certificates"]);
    let said = String::from_utf8_lossy(&again.stdout);
    assert_eq!(
        again.exit_code,
        0,
        "{said}{}",
        String::from_utf8_lossy(&again.stderr)
    );
    assert!(said.contains("0 added, 0 removed"), "{said}");
    assert_eq!(store("after the agent's run"), written);

    let fresh = run_as_root(
        &fx,
        &bottle_name,
        &["/usr/sbin/update-ca-certificates", "--fresh"],
    );
    assert_eq!(
        fresh.exit_code,
        0,
        "{}",
        String::from_utf8_lossy(&fresh.stderr)
    );
    assert_eq!(store("rebuilt from scratch by the real script"), written);
}

#[test]
fn an_image_without_a_shell_or_a_bundle_gets_the_ca_file_and_warnings() {
    let Some(mut fx) =
        support::setup("an_image_without_a_shell_or_a_bundle_gets_the_ca_file_and_warnings")
    else {
        return;
    };
    // No shell, so the tool (a shell script) cannot run; no bundle at all.
    let dockerfile = "FROM scratch\n\
         COPY update-ca-certificates /usr/sbin/update-ca-certificates\n";
    let _image = build_image(
        &mut fx,
        "bare",
        dockerfile,
        &[(
            "update-ca-certificates",
            UPDATE_CA_CERTIFICATES.as_bytes(),
            0o755,
        )],
    );
    let name = name("ca-bare");
    let (_guard, bottle) = fx.start(&name);
    let bottle_name = format!("bot-bottle-{name}");
    let ca = read_as_root(&fx, &bottle_name, "/etc/bottle/ca.pem");
    assert!(ca.starts_with("-----BEGIN CERTIFICATE-----"), "{ca}");

    let warnings = bottle.launch_warnings();
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(
        warnings[0].contains("/usr/sbin/update-ca-certificates"),
        "{warnings:?}"
    );
    assert!(
        warnings[1].contains("no system trust bundle")
            && warnings[1].contains("/etc/ssl/certs/ca-certificates.crt")
            && warnings[1].contains("/etc/pki/tls/certs/ca-bundle.crt"),
        "{warnings:?}"
    );
}
