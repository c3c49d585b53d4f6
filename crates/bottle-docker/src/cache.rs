//! The small caches under `<state_root>/.cache/`: facts that cannot change
//! for their key, remembered so a start does not find them again. Every
//! entry is written aside and renamed (a reader sees the old entry or the
//! new one), and read as a hint: anything unreadable, foreign or of
//! another shape is a miss, and a failed write costs the next start the
//! lookup it saved. The cache directory is in a directory of its own:
//! every backend's listing reads each entry of the state root as a
//! bottle's state dir, and this one holds no bottle's records.

use std::path::{Path, PathBuf};

use bottle_core::ca_install::ImageTrust;

/// The directory of the agent images' CA surveys, under the state root.
pub const CA_SURVEY_CACHE: &str = ".cache/ca-survey";

/// How a remembered survey is laid out; a file of another version is a
/// miss. 2: whether Debian's trust tool is written from outside.
const CA_SURVEY_VERSION: u32 = 2;

/// Writes `contents` to `path` aside and renames it into place, creating
/// the directory (mode 0700); whether it was written.
pub(crate) fn store(path: &Path, contents: &[u8]) -> bool {
    use std::os::unix::fs::DirBuilderExt as _;
    let aside = path.with_extension(format!("tmp{}", std::process::id()));
    let written = path.parent().is_some_and(|dir| {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .is_ok()
    }) && std::fs::write(&aside, contents).is_ok()
        && std::fs::rename(&aside, path).is_ok();
    if !written {
        let _ = std::fs::remove_file(&aside);
    }
    written
}

/// An agent image's CA survey ([`bottle_core::ca_install::survey`]),
/// remembered by the image's ID: the ID is the sha256 of the image's
/// content, and the survey is taken of the container as the launch lays
/// it out before the CA is installed, so it is the same for every bottle
/// of that image. The survey only spares the lookups; the install still
/// writes the CA in every bottle and reads each file it appends to.
#[derive(Debug, Clone)]
pub struct CaSurveyCache {
    dir: PathBuf,
}

/// One remembered survey, as stored.
#[derive(serde::Serialize, serde::Deserialize)]
struct CaSurveyEntry {
    version: u32,
    image_id: String,
    trust: ImageTrust,
}

impl CaSurveyCache {
    /// The cache under `state_root`.
    pub fn new(state_root: &Path) -> CaSurveyCache {
        CaSurveyCache {
            dir: state_root.join(CA_SURVEY_CACHE),
        }
    }

    /// The file for `image_id`, only for an ID of the Engine's shape
    /// (`sha256:` and 64 hex digits), so no ID names another path.
    fn file(&self, image_id: &str) -> Option<PathBuf> {
        let hex = image_id.strip_prefix("sha256:")?;
        (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| self.dir.join(format!("{hex}.json")))
    }

    /// The survey remembered for `image_id`, if one is there, is this
    /// version's, names this image and has the shape this bottle makes.
    pub fn lookup(&self, image_id: &str) -> Option<ImageTrust> {
        let bytes = std::fs::read(self.file(image_id)?).ok()?;
        let entry: CaSurveyEntry = serde_json::from_slice(&bytes).ok()?;
        (entry.version == CA_SURVEY_VERSION
            && entry.image_id == image_id
            && entry.trust.is_well_formed())
        .then_some(entry.trust)
    }

    /// Remembers `trust` for `image_id`; best effort.
    pub fn store(&self, image_id: &str, trust: &ImageTrust) {
        let Some(file) = self.file(image_id) else {
            return;
        };
        let entry = CaSurveyEntry {
            version: CA_SURVEY_VERSION,
            image_id: image_id.to_string(),
            trust: trust.clone(),
        };
        if let Ok(bytes) = serde_json::to_vec(&entry) {
            store(&file, &bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bottle_core::agent_box::{AgentBox, BoxFile, Entry, Refused, ToolRun};

    const IMAGE: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
    const OTHER: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

    /// A box with a system bundle and nothing else.
    struct OneBundle;

    impl AgentBox for OneBundle {
        type Error = std::convert::Infallible;
        fn entry(&mut self, path: &str) -> Result<Entry, Self::Error> {
            Ok(match path {
                "/etc/ssl/cert.pem" => Entry::File {
                    contents: b"roots\n".to_vec(),
                    mode: 0o644,
                },
                _ => Entry::Missing,
            })
        }
        fn write(&mut self, _: &str, _: &[u8], _: u32) -> Result<Result<(), Refused>, Self::Error> {
            Ok(Ok(()))
        }
        fn put(&mut self, file: &BoxFile) -> Result<Result<(), Refused>, Self::Error> {
            unreachable!("a survey puts nothing: {file:?}")
        }
        fn symlink(&mut self, _: &str, _: &str) -> Result<Result<(), Refused>, Self::Error> {
            Ok(Ok(()))
        }
        fn dir_has_entries(&mut self, _: &str) -> Result<bool, Self::Error> {
            Ok(false)
        }
        fn run(&mut self, _: &[&str], _: std::time::Duration) -> Result<ToolRun, Self::Error> {
            Ok(ToolRun::CouldNotRun("no tools here".into()))
        }
    }

    fn survey() -> ImageTrust {
        bottle_core::ca_install::survey(&mut OneBundle).unwrap()
    }

    #[test]
    fn a_survey_is_found_again_only_for_its_own_image() {
        let root = tempfile::tempdir().unwrap();
        let cache = CaSurveyCache::new(root.path());
        assert_eq!(cache.lookup(IMAGE), None);
        cache.store(IMAGE, &survey());
        assert_eq!(cache.lookup(IMAGE), Some(survey()));
        assert_eq!(cache.lookup(OTHER), None, "another image ID misses");
    }

    #[test]
    fn a_corrupt_or_foreign_entry_is_a_miss() {
        let root = tempfile::tempdir().unwrap();
        let cache = CaSurveyCache::new(root.path());
        cache.store(IMAGE, &survey());
        let file = cache.file(IMAGE).unwrap();
        let good = std::fs::read_to_string(&file).unwrap();
        // Each of these is rejected; the good entry, written back, is not.
        let foreign = good.replace(&IMAGE[7..], &OTHER[7..]);
        let this = format!("\"version\":{CA_SURVEY_VERSION}");
        let future = good.replace(&this, &format!("\"version\":{}", CA_SURVEY_VERSION + 1));
        let past = good.replace(&this, &format!("\"version\":{}", CA_SURVEY_VERSION - 1));
        let misshapen = good.replace("\"bundles\":[", "\"bundles\":[\"Absent\",");
        for bad in [
            "",
            "{not json",
            &good[..good.len() / 2],
            &foreign,
            &future,
            &past,
            &misshapen,
        ] {
            assert_ne!(bad, good);
            std::fs::write(&file, bad).unwrap();
            assert_eq!(cache.lookup(IMAGE), None, "{bad}");
        }
        std::fs::write(&file, &good).unwrap();
        assert_eq!(cache.lookup(IMAGE), Some(survey()));
    }

    #[test]
    fn an_id_of_another_shape_names_no_file() {
        let root = tempfile::tempdir().unwrap();
        let cache = CaSurveyCache::new(root.path());
        for id in [
            "sha256:../../etc",
            "",
            "1111",
            &IMAGE[..70],
            &IMAGE.replace('1', "g"),
        ] {
            cache.store(id, &survey());
            assert_eq!(cache.lookup(id), None, "{id}");
        }
        assert!(!root.path().join(CA_SURVEY_CACHE).exists());
    }
}
