//! The node's identity: an ed25519 key kept in the data directory, readable by its owner only.

use std::io::Write;
use std::path::Path;

use libp2p::identity::Keypair;

/// The key file's name inside the data directory.
pub const KEY_FILE: &str = "identity.key";

/// Loading or creating the identity failed.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// The file could not be read or written.
    #[error("identity key file {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file does not hold a key.
    #[error("identity key file {0} is corrupt (expected a protobuf-encoded libp2p keypair)")]
    Corrupt(String),
}

/// Loads the key from `dir`, or creates one (mode 0600) if there is none.
pub fn load_or_create(dir: &Path) -> Result<Keypair, IdentityError> {
    let path = dir.join(KEY_FILE);
    let shown = path.display().to_string();
    let io = |source| IdentityError::Io {
        path: shown.clone(),
        source,
    };
    match std::fs::read(&path) {
        Ok(bytes) => {
            warn_if_shared(&path);
            Keypair::from_protobuf_encoding(&bytes)
                .map_err(|_| IdentityError::Corrupt(shown.clone()))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let key = Keypair::generate_ed25519();
            let bytes = key
                .to_protobuf_encoding()
                .map_err(|_| IdentityError::Corrupt(shown.clone()))?;
            let mut opts = std::fs::OpenOptions::new();
            opts.write(true).create_new(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
            let mut f = opts.open(&path).map_err(io)?;
            f.write_all(&bytes).map_err(io)?;
            f.sync_all().map_err(io)?;
            Ok(key)
        }
        Err(e) => Err(io(e)),
    }
}

fn warn_if_shared(path: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(m) = std::fs::metadata(path)
            && m.permissions().mode() & 0o077 != 0
        {
            tracing::warn!("{} is readable by others; chmod 600 it", path.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_created_once_with_owner_only_permissions() {
        let dir = tempfile::tempdir().unwrap();
        let a = load_or_create(dir.path()).unwrap();
        let b = load_or_create(dir.path()).unwrap();
        assert_eq!(a.public().to_peer_id(), b.public().to_peer_id());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join(KEY_FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        std::fs::write(dir.path().join(KEY_FILE), b"garbage").unwrap();
        assert!(matches!(
            load_or_create(dir.path()),
            Err(IdentityError::Corrupt(_))
        ));
    }
}
