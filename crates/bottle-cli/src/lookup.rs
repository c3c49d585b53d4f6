//! What a command acts on: the manifest, the state root, a bottle's spec,
//! the backends to ask, and a running bottle found by name.

use std::path::PathBuf;

use bottle_core::backend::BackendErrorKind;
use bottle_core::{BottleSpec, Manifest, manifest, slug};

use crate::args::Global;
use crate::backends;
use crate::failure::{Failure, exit_for};

/// The manifest `--manifest` names.
pub(crate) fn load_manifest(global: &Global) -> Result<Manifest, Failure> {
    Ok(manifest::load(&global.manifest)?)
}

/// The state root (`$XDG_STATE_HOME/bottle` or its fallback).
pub(crate) fn state_root() -> Result<PathBuf, Failure> {
    Ok(bottle_core::state::state_root(|key| {
        std::env::var(key).ok()
    })?)
}

/// The state dir of the bottle `bottle` (a name or a slug) under the state
/// root.
pub(crate) fn state_dir_of(bottle: &str) -> Result<PathBuf, Failure> {
    Ok(state_root()?.join(slug::slug_of(bottle)))
}

/// The spec of bottle `name` (or a generated one) running `agent`.
pub(crate) fn spec_for(
    global: &Global,
    agent: &str,
    name: Option<&str>,
) -> Result<BottleSpec, Failure> {
    let manifest = load_manifest(global)?;
    Ok(BottleSpec::new(
        &manifest,
        &global.manifest,
        agent,
        name,
        &state_root()?,
    )?)
}

/// The backends to ask when the operator did not pick one.
pub(crate) fn backends_to_ask(global: &Global) -> Result<Vec<backends::AnyBackend>, Failure> {
    let kinds = if backends::explicit(global) {
        vec![backends::selected(global)?]
    } else {
        bottle_core::BackendKind::ALL.to_vec()
    };
    let mut opened = Vec::new();
    let mut last_error = None;
    for kind in kinds {
        match backends::open(kind, global, backends::Mode::default())
            .and_then(|b| b.preflight().map(|()| b))
        {
            Ok(backend) => opened.push(backend),
            Err(err) => last_error = Some(err),
        }
    }
    match (opened.is_empty(), last_error) {
        (true, Some(err)) => Err(err.into()),
        _ => Ok(opened),
    }
}

/// No backend asked has the bottle `name`: bad input, like a backend's own
/// not-found.
pub(crate) fn no_bottle_named(name: &str) -> Failure {
    Failure::new(
        "BOT-C004",
        exit_for(BackendErrorKind::NotFound),
        format!("no bottle named {name}"),
    )
    .with_fix("see `bottle list`")
}

/// Finds a running bottle on whichever backend runs it.
pub(crate) fn find_bottle(
    global: &Global,
    bottle: &str,
) -> Result<Box<dyn bottle_core::Bottle>, Failure> {
    find_bottle_and_backend(global, bottle).map(|(found, _)| found)
}

/// [`find_bottle`], and the backend that runs it.
pub(crate) fn find_bottle_and_backend(
    global: &Global,
    bottle: &str,
) -> Result<(Box<dyn bottle_core::Bottle>, bottle_core::BackendKind), Failure> {
    let name = slug::bottle_name(slug::slug_of(bottle));
    let mut last_error = None;
    for backend in backends_to_ask(global)? {
        match backend.attach(&name) {
            Ok(found) => return Ok((found, backend.kind())),
            Err(err) if err.kind == BackendErrorKind::NotFound => {
                last_error = Some(err);
            }
            Err(err) => return Err(err.into()),
        }
    }
    Err(last_error
        .map(Failure::from)
        .unwrap_or_else(|| no_bottle_named(&name)))
}
