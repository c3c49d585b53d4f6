//! A Python package index (PEP 503 "simple" pages) for the upstream: pure
//! Python distributions the host's python3 makes, a wheel and an sdist,
//! each linked with its `#sha256=` so `--require-hashes` works.

use std::io;
use std::path::Path;
use std::time::Duration;

use bottle_core::exec::{CommandRunner as _, CommandSpec, SystemRunner};
use serde_json::Value;

use super::Site;

/// How long making the distributions may take.
const PYTHON_TIME_LIMIT: Duration = Duration::from_secs(60);

/// The project whose wheel the index serves; it requires [`SDIST_PROJECT`].
pub const WHEEL_PROJECT: &str = "bottle-greeting";
/// The project the index serves only as an sdist: pip must build it (with
/// setuptools, as `pyproject.toml` says).
pub const SDIST_PROJECT: &str = "bottle-shout";

/// One file of the index.
#[derive(Clone, Debug)]
pub struct PythonFile {
    /// The project's normalised name.
    pub project: String,
    /// Its version.
    pub version: String,
    /// The file's name.
    pub filename: String,
    /// Its SHA-256, hex.
    pub sha256: String,
}

impl PythonFile {
    /// The requirement line pinning this file: `project==version
    /// --hash=sha256:…`.
    pub fn requirement(&self) -> String {
        format!(
            "{}=={} --hash=sha256:{}",
            self.project, self.version, self.sha256
        )
    }
}

/// Writes `bottle_greeting-1.0-py3-none-any.whl` (`import bottle_greeting;
/// bottle_greeting.greet()` says hello, shouted by the sdist's
/// `bottle_shout`) and `bottle_shout-1.0.tar.gz` under `work` with the
/// host's python3 and serves them at `https://{host}/simple/` and
/// `/packages/`.
pub fn python_index(site: Site, host: &str, work: &Path) -> io::Result<(Site, Vec<PythonFile>)> {
    std::fs::create_dir_all(work)?;
    let out = SystemRunner.run(
        &CommandSpec::new("python3")
            .args(["-c", MAKE_DISTRIBUTIONS])
            .arg(work)
            .timeout(PYTHON_TIME_LIMIT),
    )?;
    if !out.success() {
        return Err(io::Error::other(format!(
            "making the Python distributions: {}",
            out.stderr_text()
        )));
    }
    let listing: Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| io::Error::other(format!("the distributions' listing: {e}")))?;
    let files: Vec<PythonFile> = listing
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let field = |name: &str| entry.get(name)?.as_str().map(str::to_string);
            Some(PythonFile {
                project: field("project")?,
                version: field("version")?,
                filename: field("filename")?,
                sha256: field("sha256")?,
            })
        })
        .collect();
    let mut site = site;
    let mut root = String::from("<!DOCTYPE html>\n<html><body>\n");
    for file in &files {
        root.push_str(&format!("<a href=\"/simple/{0}/\">{0}</a>\n", file.project));
        let page = format!(
            "<!DOCTYPE html>\n<html><body>\n<a href=\"/packages/{0}#sha256={1}\">{0}</a>\n</body></html>\n",
            file.filename, file.sha256
        );
        site = site
            .page(
                host,
                &format!("/simple/{}/", file.project),
                "text/html",
                page,
            )
            .page(
                host,
                &format!("/packages/{}", file.filename),
                "application/octet-stream",
                std::fs::read(work.join(&file.filename))?,
            );
    }
    root.push_str("</body></html>\n");
    Ok((site.page(host, "/simple/", "text/html", root), files))
}

/// Writes the wheel and the sdist into `sys.argv[1]` and prints a JSON
/// listing of them. Fixed timestamps, so the files (and their hashes) are
/// the same on every run.
const MAKE_DISTRIBUTIONS: &str = r#"
import base64, hashlib, io, json, os, sys, tarfile, zipfile
out = sys.argv[1]

def wheel(name, version, modules, requires):
    dist = f"{name}-{version}"
    metadata = f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
    files = dict(modules)
    files[f"{dist}.dist-info/METADATA"] = metadata
    files[f"{dist}.dist-info/WHEEL"] = "Wheel-Version: 1.0\nGenerator: bottle-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{dist}.dist-info/RECORD,,")
    files[f"{dist}.dist-info/RECORD"] = "\n".join(record) + "\n"
    filename = f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(out, filename), "w") as archive:
        for path, text in files.items():
            archive.writestr(zipfile.ZipInfo(path, (2020, 1, 1, 0, 0, 0)), text)
    return filename

def sdist(name, version, modules):
    dist = f"{name}-{version}"
    project = name.replace("_", "-")
    files = dict(modules)
    files["pyproject.toml"] = (
        "[build-system]\nrequires = [\"setuptools>=61\"]\nbuild-backend = \"setuptools.build_meta\"\n\n"
        f"[project]\nname = \"{project}\"\nversion = \"{version}\"\ndescription = \"made by bottle's tests\"\n\n"
        "[tool.setuptools]\npy-modules = [" + ", ".join(f'"{m[:-3]}"' for m in modules) + "]\n"
    )
    files["PKG-INFO"] = f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n"
    filename = f"{dist}.tar.gz"
    with open(os.path.join(out, filename), "wb") as raw:
        import gzip
        with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as gz:
            with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as archive:
                for path, text in files.items():
                    data = text.encode()
                    info = tarfile.TarInfo(f"{dist}/{path}")
                    info.size, info.mtime, info.mode = len(data), 1577836800, 0o644
                    archive.addfile(info, io.BytesIO(data))
    return filename

made = [
    ("bottle-greeting", "1.0", wheel("bottle_greeting", "1.0", {
        "bottle_greeting/__init__.py": "from bottle_shout import shout\n\ndef greet():\n    return shout('hello from bottle-greeting')\n",
    }, ["bottle-shout"])),
    ("bottle-shout", "1.0", sdist("bottle_shout", "1.0", {
        "bottle_shout.py": "def shout(text):\n    return text.upper() + '!'\n",
    })),
]
listing = []
for project, version, filename in made:
    with open(os.path.join(out, filename), "rb") as f:
        listing.append({"project": project, "version": version, "filename": filename, "sha256": hashlib.sha256(f.read()).hexdigest()})
print(json.dumps(listing))
"#;
