//! The session token, read from its file and read again whenever the file changes (SPEC 15): an
//! orchestrator renews a token by rewriting the file, and the bridge picks it up on its next call
//! without a restart. Each call costs one `stat`; the file is read only when that changes.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use tokio::sync::Mutex;

/// What tells one version of the file from the next: a rewrite in place changes the time or the
/// length, a replacement by rename changes the inode.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Version {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

impl Version {
    fn of(metadata: &std::fs::Metadata) -> Version {
        use std::os::unix::fs::MetadataExt as _;
        Version {
            modified: metadata.modified().ok(),
            len: metadata.len(),
            inode: metadata.ino(),
        }
    }
}

/// The token file and the last token it held.
pub struct TokenFile {
    path: PathBuf,
    state: Mutex<State>,
}

struct State {
    /// The version of the file last read, token or not: an unchanged file is not read again.
    seen: Version,
    token: String,
}

impl TokenFile {
    /// Reads the token at start; a missing file, or one that holds no token, is an error.
    pub fn open(path: &Path) -> Result<TokenFile, String> {
        let metadata =
            std::fs::metadata(path).map_err(|e| format!("token file {}: {e}", path.display()))?;
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("token file {}: {e}", path.display()))?;
        let token = as_token(&text).ok_or_else(|| {
            format!(
                "token file {} does not hold a token (it is empty, or not a JWT)",
                path.display()
            )
        })?;
        Ok(TokenFile {
            path: path.to_path_buf(),
            state: Mutex::new(State {
                seen: Version::of(&metadata),
                token,
            }),
        })
    }

    /// The token to sign with now: the file's, when it changed and holds one; else the last one.
    pub async fn current(&self) -> String {
        let mut state = self.state.lock().await;
        let Ok(metadata) = tokio::fs::metadata(&self.path).await else {
            // Gone for a moment (a writer that removes, then creates): keep the last token.
            return state.token.clone();
        };
        let version = Version::of(&metadata);
        if version == state.seen {
            return state.token.clone();
        }
        match tokio::fs::read_to_string(&self.path)
            .await
            .ok()
            .as_deref()
            .and_then(as_token)
        {
            Some(token) => {
                state.token = token;
                tracing::info!(file = %self.path.display(), "read a new token from the token file");
            }
            None => tracing::warn!(
                file = %self.path.display(),
                "the token file does not hold a token; the last token stays in use until the file changes"
            ),
        }
        state.seen = version;
        state.token.clone()
    }
}

/// The token in a file's text (white space around it ignored), when the text has a JWT's shape: three
/// non-empty base64url parts. Anything else (a half-written file, a stray edit) is not a token.
fn as_token(text: &str) -> Option<String> {
    let token = text.trim();
    let parts: Vec<&str> = token.split('.').collect();
    let base64url = |part: &&str| {
        !part.is_empty()
            && part
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    (parts.len() == 3 && parts.iter().all(base64url)).then(|| token.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "eyJhbGciOiJFZERTQSJ9.eyJzdWIiOiJhIn0.c2ln";

    #[test]
    fn a_token_is_three_base64url_parts_with_white_space_around_ignored() {
        assert_eq!(as_token(&format!("\n {TOKEN} \n")).as_deref(), Some(TOKEN));
        for not_a_token in ["", "  \n", "a.b", "a..c", "a.b.c.d", "a.b.c d", "a.b+.c"] {
            assert_eq!(as_token(not_a_token), None, "{not_a_token:?}");
        }
    }

    #[tokio::test]
    async fn a_rewritten_file_is_read_again_and_one_without_a_token_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, TOKEN).unwrap();
        let file = TokenFile::open(&path).unwrap();
        assert_eq!(file.current().await, TOKEN);
        // Replaced by rename, as an orchestrator does: a new inode.
        let next = "eyJhbGciOiJFZERTQSJ9.eyJzdWIiOiJiIn0.c2ln";
        std::fs::write(dir.path().join("next"), next).unwrap();
        std::fs::rename(dir.path().join("next"), &path).unwrap();
        assert_eq!(file.current().await, next);
        std::fs::write(&path, "half-writ").unwrap();
        assert_eq!(file.current().await, next);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(file.current().await, next);
    }

    #[test]
    fn a_missing_empty_or_tokenless_file_at_start_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        assert!(TokenFile::open(&path).is_err());
        std::fs::write(&path, "\n").unwrap();
        assert!(TokenFile::open(&path)
            .err()
            .unwrap()
            .contains("does not hold a token"));
    }
}
