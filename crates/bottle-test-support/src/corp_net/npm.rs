//! An npm registry for the upstream: packages the test writes, packed by
//! the real `npm pack` (so the tarballs, `dist.integrity` and
//! `dist.shasum` are npm's own), served as packuments and tarballs, and the
//! audit endpoint npm posts to after an install.

use std::io;
use std::path::Path;
use std::time::Duration;

use bottle_core::exec::{CommandRunner as _, CommandSpec, SystemRunner};
use serde_json::{Value, json};

use super::Site;

/// How long one `npm pack` may take.
const NPM_PACK_TIME_LIMIT: Duration = Duration::from_secs(120);
/// Where npm (6 and later) posts the installed tree's advisories query.
pub const NPM_BULK_ADVISORIES: &str = "/-/npm/v1/security/advisories/bulk";

/// One package to publish.
#[derive(Clone, Debug)]
pub struct NpmPackage {
    /// Its name, scoped (`@scope/name`) or not.
    pub name: String,
    /// Its version.
    pub version: String,
    /// Its dependencies: name and version range.
    pub dependencies: Vec<(String, String)>,
    /// Its `index.js`.
    pub index_js: String,
}

impl NpmPackage {
    /// A package `name@version` whose `index.js` is `index_js`, with no
    /// dependencies yet.
    pub fn new(name: &str, version: &str, index_js: &str) -> NpmPackage {
        NpmPackage {
            name: name.to_string(),
            version: version.to_string(),
            dependencies: Vec::new(),
            index_js: index_js.to_string(),
        }
    }

    /// Adds a dependency on `name` at `range`.
    pub fn depends_on(mut self, name: &str, range: &str) -> NpmPackage {
        self.dependencies
            .push((name.to_string(), range.to_string()));
        self
    }

    /// The name without its scope: what the tarball is named after.
    fn base_name(&self) -> &str {
        self.name
            .rsplit_once('/')
            .map_or(self.name.as_str(), |(_, base)| base)
    }
}

/// What the registry serves for one package.
#[derive(Clone, Debug)]
pub struct NpmPublished {
    /// The package's name.
    pub name: String,
    /// Its one version.
    pub version: String,
    /// The tarball's URL on the registry.
    pub tarball_url: String,
    /// `dist.integrity`: sha512 SRI, as `npm pack` computed it.
    pub integrity: String,
    /// `dist.shasum`: the tarball's SHA-1, hex.
    pub shasum: String,
}

/// Packs every package with the real `npm pack` under `work` and serves
/// the registry at `https://{host}/` on `site`: a packument per package
/// (at `/name`, and `/@scope%2fname` as npm asks for a scoped one), each
/// tarball, and `{}` from the bulk advisories endpoint.
pub fn npm_registry(
    mut site: Site,
    host: &str,
    work: &Path,
    packages: &[NpmPackage],
) -> io::Result<(Site, Vec<NpmPublished>)> {
    let tarballs = work.join("tarballs");
    std::fs::create_dir_all(&tarballs)?;
    let mut published = Vec::new();
    for package in packages {
        let source = work.join("src").join(package.name.replace('/', "__"));
        std::fs::create_dir_all(&source)?;
        let dependencies: serde_json::Map<String, Value> = package
            .dependencies
            .iter()
            .map(|(name, range)| (name.clone(), Value::String(range.clone())))
            .collect();
        let manifest = json!({
            "name": package.name,
            "version": package.version,
            "description": "a package made by bottle's tests",
            "main": "index.js",
            "license": "MIT",
            "dependencies": dependencies,
        });
        std::fs::write(source.join("package.json"), manifest.to_string())?;
        std::fs::write(source.join("index.js"), &package.index_js)?;
        let packed = pack(&source, &tarballs, work)?;
        let file = format!("{}-{}.tgz", package.base_name(), package.version);
        let tarball_path = format!("/{}/-/{file}", package.name);
        let tarball_url = format!("https://{host}{tarball_path}");
        let version = json!({
            "name": package.name,
            "version": package.version,
            "main": "index.js",
            "license": "MIT",
            "dependencies": dependencies,
            "dist": {
                "tarball": tarball_url,
                "integrity": packed.integrity,
                "shasum": packed.shasum,
            },
        });
        let packument = json!({
            "_id": package.name,
            "name": package.name,
            "dist-tags": { "latest": package.version },
            "versions": { package.version.clone(): version },
        })
        .to_string();
        let mut paths = vec![format!("/{}", package.name)];
        if let Some((scope, base)) = package.name.split_once('/') {
            paths.push(format!("/{scope}%2f{base}"));
            paths.push(format!("/{scope}%2F{base}"));
        }
        for path in paths {
            site = site.page(host, &path, "application/json", packument.clone());
        }
        site = site.page(
            host,
            &tarball_path,
            "application/octet-stream",
            std::fs::read(tarballs.join(&packed.filename))?,
        );
        published.push(NpmPublished {
            name: package.name.clone(),
            version: package.version.clone(),
            tarball_url,
            integrity: packed.integrity,
            shasum: packed.shasum,
        });
    }
    // npm audits what it installed: an empty answer says "no advisories".
    site = site.page(host, NPM_BULK_ADVISORIES, "application/json", "{}");
    Ok((site, published))
}

struct Packed {
    filename: String,
    integrity: String,
    shasum: String,
}

/// `npm pack --json` in `source`, its tarball written to `destination`, its
/// cache kept under `work` (not the user's).
fn pack(source: &Path, destination: &Path, work: &Path) -> io::Result<Packed> {
    let out = SystemRunner.run(
        &CommandSpec::new("npm")
            .args(["pack", "--json", "--pack-destination"])
            .arg(destination)
            .cwd(source)
            .env("npm_config_cache", work.join("npm-cache"))
            .env("npm_config_update_notifier", "false")
            .timeout(NPM_PACK_TIME_LIMIT),
    )?;
    if !out.success() {
        return Err(io::Error::other(format!(
            "npm pack in {}: {}",
            source.display(),
            out.stderr_text()
        )));
    }
    let listing: Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| io::Error::other(format!("npm pack --json printed no JSON: {e}")))?;
    let entry = listing
        .get(0)
        .ok_or_else(|| io::Error::other("npm pack --json listed nothing"))?;
    let field = |name: &str| {
        entry
            .get(name)
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| io::Error::other(format!("npm pack --json has no {name}")))
    };
    Ok(Packed {
        filename: field("filename")?,
        integrity: field("integrity")?,
        shasum: field("shasum")?,
    })
}
