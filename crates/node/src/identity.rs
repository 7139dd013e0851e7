//! The node's identity: an ed25519 key kept in the data directory, readable by its owner only.

use std::path::Path;

use libp2p::identity::Keypair;

use crate::access::{SecretFileError, read_secret, write_secret};

/// The key file's name inside the data directory.
pub const KEY_FILE: &str = "identity.key";

/// Loading or creating the identity failed.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// The file could not be read or written, or others than its owner may read it.
    #[error("identity key file {0}")]
    File(#[from] SecretFileError),
    /// The file does not hold a key.
    #[error("identity key file {0} is corrupt (expected a protobuf-encoded libp2p keypair)")]
    Corrupt(String),
}

/// Loads the key from `dir`, or creates one if there is none: written whole or not at all
/// (a temporary file, synced, renamed), readable by its owner only. A key file others may
/// read is refused: its key no longer identifies this node alone.
pub fn load_or_create(dir: &Path) -> Result<Keypair, IdentityError> {
    let path = dir.join(KEY_FILE);
    let shown = path.display().to_string();
    match read_secret(&path)? {
        Some(bytes) => Keypair::from_protobuf_encoding(&bytes)
            .map_err(|_| IdentityError::Corrupt(shown.clone())),
        None => {
            let key = Keypair::generate_ed25519();
            let bytes = key
                .to_protobuf_encoding()
                .map_err(|_| IdentityError::Corrupt(shown.clone()))?;
            write_secret(&path, &bytes)?;
            Ok(key)
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
        #[cfg(unix)]
        {
            // Readable by others: refused, with the command that mends it.
            use std::os::unix::fs::PermissionsExt;
            let path = dir.path().join(KEY_FILE);
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
            let e = load_or_create(dir.path()).unwrap_err();
            assert!(matches!(e, IdentityError::File(SecretFileError::Shared(_))));
            assert!(e.to_string().contains("chmod 600"), "{e}");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        std::fs::write(dir.path().join(KEY_FILE), b"garbage").unwrap();
        assert!(matches!(
            load_or_create(dir.path()),
            Err(IdentityError::Corrupt(_))
        ));
    }
}
