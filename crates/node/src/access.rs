//! Who may drive the node's HTTP API.
//!
//! The API drives everything the node can do (submit, cancel, change a queue's config), so a
//! request must come from the node's owner:
//!
//! - **Bound to a loopback address** (the default, `127.0.0.1:7700`), only programs on this
//!   machine reach it, and the one such program that does not act for the owner is a web page
//!   in the owner's browser. A browser names the page's site in `Origin` on a cross-origin
//!   request, and a DNS-rebinding page reaches the API under its own host name (`Host`). So a
//!   request whose `Origin` or `Host` is not one of the node's own loopback names (`127.0.0.1`,
//!   `localhost`, `[::1]`, with the API's port) is refused with 403. A request with neither
//!   (the CLI, curl) is served.
//! - **Bound beyond loopback**, anyone who reaches the address could drive the node: every
//!   request must carry the node's token (`Authorization: Bearer <token>`), else 401.
//!
//! The token is in the data directory ([`TOKEN_FILE`], readable by its owner only), made at
//! the node's first start ([`load_or_create_token`]); `piecework` reads it from there
//! (`--data-dir`) or from `PIECEWORK_TOKEN`.

use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// The token file's name inside the data directory.
pub const TOKEN_FILE: &str = "api-token";

/// Reading or writing a file the node keeps secret failed.
#[derive(Debug, thiserror::Error)]
pub enum SecretFileError {
    /// The file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file does not hold what it should.
    #[error("{0} is corrupt: {1}")]
    Corrupt(String, &'static str),
    /// Others than its owner may read it.
    #[error("{0} is readable by others than its owner: run `chmod 600 {0}`")]
    Shared(String),
}

/// Writes `bytes` to `path` whole or not at all: into a temporary file beside it (owner-only),
/// synced, then renamed over `path`, and the directory synced.
pub(crate) fn write_secret(path: &Path, bytes: &[u8]) -> Result<(), SecretFileError> {
    let shown = path.display().to_string();
    let io = |source| SecretFileError::Io {
        path: shown.clone(),
        source,
    };
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let mut f = opts.open(&tmp).map_err(io)?;
    f.write_all(bytes).map_err(io)?;
    f.sync_all().map_err(io)?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(io)?;
    if let Some(dir) = path.parent() {
        // The rename is durable once the directory is.
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io)?;
    }
    Ok(())
}

/// Reads a secret file, refusing one that others than its owner may read.
pub(crate) fn read_secret(path: &Path) -> Result<Option<Vec<u8>>, SecretFileError> {
    let shown = path.display().to_string();
    match std::fs::read(path) {
        Ok(bytes) => {
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                let m = std::fs::metadata(path).map_err(|source| SecretFileError::Io {
                    path: shown.clone(),
                    source,
                })?;
                if m.permissions().mode() & 0o077 != 0 {
                    return Err(SecretFileError::Shared(shown));
                }
            }
            Ok(Some(bytes))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(SecretFileError::Io {
            path: shown,
            source,
        }),
    }
}

/// The API token kept in `dir`, made (32 random bytes, hex) if there is none.
///
/// # Errors
/// The file cannot be read or written, is readable by others, or holds no token.
pub fn load_or_create_token(dir: &Path) -> Result<String, SecretFileError> {
    let path = dir.join(TOKEN_FILE);
    if let Some(bytes) = read_secret(&path)? {
        let token = String::from_utf8(bytes)
            .map_err(|_| SecretFileError::Corrupt(path.display().to_string(), "not text"))?;
        let token = token.trim().to_owned();
        if token.is_empty() {
            return Err(SecretFileError::Corrupt(
                path.display().to_string(),
                "empty",
            ));
        }
        return Ok(token);
    }
    let token: String = rand::random::<[u8; 32]>()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    write_secret(&path, token.as_bytes())?;
    Ok(token)
}

/// What the API asks of a request, from the address it is bound to.
#[derive(Clone, Debug)]
pub struct Access {
    /// Bound beyond loopback: the token every request must carry.
    token: Option<Arc<str>>,
    /// Bound to loopback: the `host:port` names a request's `Origin` and `Host` may give.
    own: Vec<String>,
}

impl Access {
    /// The policy for an API bound to `addr`, with the node's `token`.
    pub fn for_addr(addr: SocketAddr, token: &str) -> Access {
        if addr.ip().is_loopback() {
            let port = addr.port();
            Access {
                token: None,
                own: vec![
                    format!("127.0.0.1:{port}"),
                    format!("localhost:{port}"),
                    format!("[::1]:{port}"),
                    addr.to_string(),
                ],
            }
        } else {
            Access {
                token: Some(token.into()),
                own: Vec::new(),
            }
        }
    }

    /// Why `headers` may not drive the node, if they may not: the status and the message.
    pub fn refusal(&self, headers: &HeaderMap) -> Option<(StatusCode, String)> {
        if let Some(token) = &self.token {
            let given = headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "));
            return match given {
                Some(g) if same(g.trim().as_bytes(), token.as_bytes()) => None,
                Some(_) => Some((
                    StatusCode::UNAUTHORIZED,
                    "the API token given is not this node's".into(),
                )),
                None => Some((
                    StatusCode::UNAUTHORIZED,
                    format!(
                        "this node's API is bound beyond loopback: every request needs its token \
                         (`Authorization: Bearer <token>`; the token is in the node's data \
                         directory, file {TOKEN_FILE}; the CLI reads it with --data-dir or \
                         PIECEWORK_TOKEN)"
                    ),
                )),
            };
        }
        let text = |name| headers.get(name).and_then(|v| v.to_str().ok());
        if let Some(origin) = text(header::ORIGIN) {
            // `scheme://host[:port]`; a browser's opaque origin is `null`.
            let host = origin.split_once("://").map(|(_, h)| h);
            if host.is_none_or(|h| !self.is_own(h)) {
                return Some((
                    StatusCode::FORBIDDEN,
                    format!("a request from another origin ({origin}) may not drive this node"),
                ));
            }
        }
        if let Some(host) = text(header::HOST)
            && !self.is_own(host)
        {
            return Some((
                StatusCode::FORBIDDEN,
                format!("a request for another host ({host}) may not drive this node"),
            ));
        }
        None
    }

    fn is_own(&self, host: &str) -> bool {
        self.own.iter().any(|o| o.eq_ignore_ascii_case(host))
    }
}

/// Byte strings compared in time that depends on their lengths only.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// The middleware that refuses the requests [`Access::refusal`] refuses.
pub(crate) async fn guard(State(access): State<Access>, req: Request, next: Next) -> Response {
    match access.refusal(req.headers()) {
        Some((code, error)) => (code, axum::Json(crate::api::ApiError { error })).into_response(),
        None => next.run(req).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(k.clone(), v.parse().unwrap());
        }
        h
    }

    #[test]
    fn on_loopback_only_the_nodes_own_origin_and_host_pass() {
        let a = Access::for_addr("127.0.0.1:7700".parse().unwrap(), "t");
        assert!(a.refusal(&headers(&[])).is_none());
        assert!(
            a.refusal(&headers(&[(header::HOST, "127.0.0.1:7700")]))
                .is_none()
        );
        assert!(
            a.refusal(&headers(&[
                (header::HOST, "localhost:7700"),
                (header::ORIGIN, "http://localhost:7700")
            ]))
            .is_none()
        );
        for bad in [
            &[(header::ORIGIN, "https://evil.example")][..],
            &[(header::ORIGIN, "null")][..],
            &[(header::ORIGIN, "http://127.0.0.1:8080")][..],
            &[(header::HOST, "evil.example:7700")][..],
        ] {
            let r = a.refusal(&headers(bad));
            assert_eq!(r.map(|r| r.0), Some(StatusCode::FORBIDDEN), "{bad:?}");
        }
    }

    #[test]
    fn beyond_loopback_every_request_needs_the_token() {
        let a = Access::for_addr("0.0.0.0:7700".parse().unwrap(), "secret");
        let code = |h: &[(header::HeaderName, &str)]| a.refusal(&headers(h)).map(|r| r.0);
        assert_eq!(code(&[]), Some(StatusCode::UNAUTHORIZED));
        assert_eq!(
            code(&[(header::AUTHORIZATION, "Bearer nope")]),
            Some(StatusCode::UNAUTHORIZED)
        );
        assert_eq!(code(&[(header::AUTHORIZATION, "Bearer secret")]), None);
        assert_eq!(
            code(&[
                (header::AUTHORIZATION, "Bearer secret"),
                (header::HOST, "10.0.0.5:7700")
            ]),
            None
        );
    }

    #[test]
    fn the_token_is_made_once_owner_only_and_a_shared_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let t = load_or_create_token(dir.path()).unwrap();
        assert_eq!(t.len(), 64);
        assert_eq!(load_or_create_token(dir.path()).unwrap(), t);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let path = dir.path().join(TOKEN_FILE);
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
            let e = load_or_create_token(dir.path()).unwrap_err();
            assert!(e.to_string().contains("chmod 600"), "{e}");
        }
    }
}
