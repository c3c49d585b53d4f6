//! The credentials egress injects on the agent's behalf (the agent never
//! holds them), and the masking of them out of what the upstream answers.

use std::collections::HashMap;
use std::sync::Arc;

use bottle_core::bundle::BundleCredential;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::body::Incoming;

use crate::BundleError;
use crate::body::{BoxBody, ScrubBody, boxed};

/// A credential ready to inject.
#[derive(Debug, Clone)]
struct Injection {
    name: String,
    header: HeaderName,
    value: HeaderValue,
    secret: String,
}

/// A host's masking pattern and the length of its longest secret (what
/// masking must see whole across chunk boundaries).
type Mask = (Arc<regex::bytes::Regex>, usize);

/// Every configured credential by host, read at start, and per host the
/// pattern that masks its secrets.
pub(super) struct Credentials {
    injections: HashMap<String, Vec<Injection>>,
    masks: HashMap<String, Mask>,
}

impl Credentials {
    /// Reads every credential now, so that a missing secret stops the
    /// bundle instead of failing later.
    pub(super) fn load(credentials: &[BundleCredential]) -> Result<Self, BundleError> {
        let mut injections: HashMap<String, Vec<Injection>> = HashMap::new();
        for c in credentials {
            let host =
                crate::allowlist::normalize_host(&c.host).map_err(|e| BundleError::Credential {
                    name: c.name.clone(),
                    path: c.file.clone(),
                    detail: format!("host {:?}: {e}", c.host),
                })?;
            injections
                .entry(host.to_string())
                .or_default()
                .push(read_credential(c)?);
        }
        let mut masks = HashMap::new();
        for (host, injs) in &injections {
            let pattern = injs
                .iter()
                .map(|i| regex::escape(&i.secret))
                .collect::<Vec<_>>()
                .join("|");
            let re = regex::bytes::Regex::new(&format!("(?-u){pattern}")).map_err(|e| {
                BundleError::Credential {
                    name: host.clone(),
                    path: String::new(),
                    detail: format!("cannot build the masking pattern: {e}"),
                }
            })?;
            let max = injs.iter().map(|i| i.secret.len()).max().unwrap_or(1);
            masks.insert(host.clone(), (Arc::new(re), max));
        }
        Ok(Self { injections, masks })
    }

    /// Sets `host`'s credentials on a request going upstream; returns the
    /// names of those it set (for the audit line: names, never values).
    pub(super) fn inject(&self, host: &str, headers: &mut HeaderMap) -> Vec<&str> {
        let Some(injs) = self.injections.get(host) else {
            return Vec::new();
        };
        for inj in injs {
            // The agent's own value is dropped, never merged.
            headers.remove(&inj.header);
            headers.insert(inj.header.clone(), inj.value.clone());
        }
        // Compressed responses would hide an echoed secret from masking.
        headers.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("identity"),
        );
        injs.iter().map(|i| i.name.as_str()).collect()
    }

    /// Masks `host`'s secrets out of a response's headers and body.
    pub(super) fn mask(&self, host: &str, headers: &mut HeaderMap, body: Incoming) -> BoxBody {
        match self.masks.get(host) {
            Some((re, max)) => {
                for v in headers.values_mut() {
                    let mut bytes = v.as_bytes().to_vec();
                    if crate::body::mask_in_place(re, &mut bytes)
                        && let Ok(nv) = HeaderValue::from_bytes(&bytes)
                    {
                        *v = nv;
                    }
                }
                boxed(ScrubBody::new(body, re.clone(), *max))
            }
            None => boxed(body),
        }
    }

    /// Whether the bundle holds a credential for `host`.
    pub(super) fn has(&self, host: &str) -> bool {
        self.injections.contains_key(host)
    }

    /// Names of the credentials injected for `host`.
    pub(super) fn names(&self, host: &str) -> Vec<String> {
        self.injections
            .get(host)
            .map(|v| v.iter().map(|i| i.name.clone()).collect())
            .unwrap_or_default()
    }
}

fn read_credential(c: &BundleCredential) -> Result<Injection, BundleError> {
    let err = |detail: String| BundleError::Credential {
        name: c.name.clone(),
        path: c.file.clone(),
        detail,
    };
    let raw = std::fs::read_to_string(&c.file).map_err(|e| err(e.to_string()))?;
    let secret = raw.trim_end_matches(['\n', '\r']).to_string();
    if secret.is_empty() {
        return Err(err("the file is empty".into()));
    }
    let header = HeaderName::from_bytes(c.header.as_bytes())
        .map_err(|_| err(format!("{:?} is not a valid header name", c.header)))?;
    let formatted = if c.format.contains("{}") {
        c.format.replace("{}", &secret)
    } else {
        secret.clone()
    };
    let mut value = HeaderValue::from_str(&formatted)
        .map_err(|_| err("the secret is not a valid header value".into()))?;
    value.set_sensitive(true);
    Ok(Injection {
        name: c.name.clone(),
        header,
        value,
        secret,
    })
}
