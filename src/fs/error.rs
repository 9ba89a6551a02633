//! A request's failure: the errno the kernel gets and what caused it, logged once, where the
//! reply goes out (`fuse.rs`); and the one table from interface errors to errno (docs/design.md
//! §3). Logic below the adapter returns `Error` and never logs a failure it returns.

use std::fmt;

use fuser::Errno;

use crate::api::ErrorKind;

/// Why a request failed: its errno, with the backend's answer, the local I/O error or the words
/// of what this mount found behind it, so an EIO reaches the log with its cause.
pub(crate) struct Error {
    errno: Errno,
    cause: Cause,
}

enum Cause {
    /// The errno says it all: a name not there, a name taken, a write to a read-only folder.
    Plain,
    /// The backend's answer.
    Backend(crate::api::Error),
    /// A local file's: staging, the read cache, the pins' list.
    Io(std::io::Error),
    /// What this mount found, in words, and how loudly to say it.
    Found(String, log::Level),
}

impl Error {
    /// EIO for what this mount found failing (`what` says it for the log).
    pub(crate) fn failed(what: impl Into<String>) -> Error {
        Error {
            errno: Errno::EIO,
            cause: Cause::Found(what.into(), log::Level::Warn),
        }
    }

    /// EIO for a state this mount should never be in: logged as an error.
    pub(crate) fn bug(what: impl Into<String>) -> Error {
        Error {
            errno: Errno::EIO,
            cause: Cause::Found(what.into(), log::Level::Error),
        }
    }

    pub(crate) fn errno(&self) -> Errno {
        self.errno
    }

    /// The errno the kernel gets for `op`, with the cause logged at the level it deserves: a
    /// plain errno or an answer that says no more (not found, taken) at debug, a failure to
    /// reach or use the store or a local file at warn, a refused token at error with what to do.
    pub(crate) fn reply(self, op: &str) -> Errno {
        let level = match &self.cause {
            Cause::Plain => log::Level::Debug,
            Cause::Backend(e) => match e.kind {
                ErrorKind::Auth => log::Level::Error,
                ErrorKind::Precondition | ErrorKind::Network | ErrorKind::Server => {
                    log::Level::Warn
                }
                _ => log::Level::Debug,
            },
            Cause::Io(_) => log::Level::Warn,
            Cause::Found(_, level) => *level,
        };
        log::log!(level, "{op}: {self}");
        self.errno
    }
}

impl From<Errno> for Error {
    fn from(errno: Errno) -> Error {
        Error {
            errno,
            cause: Cause::Plain,
        }
    }
}

impl From<crate::api::Error> for Error {
    fn from(e: crate::api::Error) -> Error {
        Error {
            errno: errno(&e),
            cause: Cause::Backend(e),
        }
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Error {
        Error {
            errno: e.raw_os_error().map(Errno::from_i32).unwrap_or(Errno::EIO),
            cause: Cause::Io(e),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The errno as strerror says it ("Input/output error (os error 5)").
        let errno = std::io::Error::from_raw_os_error(self.errno.code());
        match &self.cause {
            Cause::Io(e) if e.raw_os_error() == Some(self.errno.code()) => return write!(f, "{e}"),
            _ => write!(f, "{errno}")?,
        }
        match &self.cause {
            Cause::Plain => Ok(()),
            Cause::Backend(e) if e.kind == ErrorKind::Auth => {
                write!(f, ": the server refused our token: {e}")?;
                // The remote backend says how, with its server and email; else in short.
                match e.message.contains("vaultfs login") {
                    true => Ok(()),
                    false => write!(f, " (run `vaultfs login` again)"),
                }
            }
            Cause::Backend(e) => write!(f, ": {e}"),
            Cause::Io(e) => write!(f, ": {e}"),
            Cause::Found(what, _) => write!(f, ": {what}"),
        }
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Errors compare by errno: what the kernel (and a test) sees.
impl PartialEq for Error {
    fn eq(&self, other: &Error) -> bool {
        self.errno == other.errno
    }
}

/// The errno a failed backend call surfaces as.
fn errno(e: &crate::api::Error) -> Errno {
    // Codes first: some conflicts have a precise POSIX meaning.
    match e.code.as_ref() {
        "not_empty" => return Errno::ENOTEMPTY,
        "not_a_folder" => return Errno::ENOTDIR,
        "move_into_self" => return Errno::EINVAL,
        "bad_path" => return Errno::EINVAL,
        "path_too_deep" => return Errno::ENAMETOOLONG,
        "file_too_large" => return Errno::EFBIG,
        // A read that found another version than the one it started on (`cache::CHANGED`).
        "changed" => return Errno::ESTALE,
        _ => {}
    }
    match e.kind {
        ErrorKind::NotFound => Errno::ENOENT,
        ErrorKind::Conflict => Errno::EEXIST,
        ErrorKind::Forbidden => Errno::EACCES,
        ErrorKind::Auth => Errno::EACCES,
        ErrorKind::BadRequest | ErrorKind::RangeNotSatisfiable | ErrorKind::UnsupportedMedia => {
            Errno::EINVAL
        }
        ErrorKind::MethodNotAllowed => Errno::ENOTSUP,
        ErrorKind::TooLarge => Errno::EFBIG,
        ErrorKind::InsufficientStorage => Errno::ENOSPC,
        ErrorKind::TooManyRequests | ErrorKind::Unavailable => Errno::EAGAIN,
        // The uploader keeps a conflicting edit beside the other version; one that reaches a
        // caller is a failure to store.
        ErrorKind::Precondition | ErrorKind::Network | ErrorKind::Server => Errno::EIO,
    }
}

/// Whether an upload that failed this way may succeed later (keep retrying) or never will.
pub fn is_transient(e: &crate::api::Error) -> bool {
    matches!(
        e.kind,
        ErrorKind::Network
            | ErrorKind::Server
            | ErrorKind::TooManyRequests
            | ErrorKind::Unavailable
            | ErrorKind::InsufficientStorage
            | ErrorKind::Auth
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_carries_its_errno_and_says_its_cause() {
        let e = Error::from(crate::api::Error::new(
            ErrorKind::Network,
            "network",
            "GET /files/id/x failed: connection refused",
        ));
        assert_eq!(e.errno(), Errno::EIO);
        assert_eq!(
            e.to_string(),
            "Input/output error (os error 5): GET /files/id/x failed: connection refused"
        );
        let e = Error::from(std::io::Error::from_raw_os_error(libc::ENOSPC));
        assert_eq!(e.errno(), Errno::ENOSPC);
        assert_eq!(e.to_string(), "No space left on device (os error 28)");
        let e = Error::from(std::io::Error::other("torn record"));
        assert_eq!(e.errno(), Errno::EIO);
        assert_eq!(
            e.to_string(),
            "Input/output error (os error 5): torn record"
        );
        assert_eq!(
            Error::from(Errno::ENOENT).to_string(),
            "No such file or directory (os error 2)"
        );
        let e = Error::failed("the batch that stores it failed");
        assert_eq!((e.errno(), e.reply("fsync")), (Errno::EIO, Errno::EIO));
    }

    #[test]
    fn codes_come_before_kinds() {
        let mut e = crate::api::Error::new(ErrorKind::Conflict, "exists", "folder not empty");
        assert_eq!(Error::from(e.clone()).errno(), Errno::EEXIST);
        e.code = "not_empty".into();
        assert_eq!(Error::from(e).errno(), Errno::ENOTEMPTY);
        let auth = crate::api::Error::new(ErrorKind::Auth, "invalid_token", "expired");
        assert_eq!(Error::from(auth.clone()).errno(), Errno::EACCES);
        assert!(
            Error::from(auth)
                .to_string()
                .contains("run `vaultfs login` again")
        );
        // Said once, where the backend said it already.
        let hinted = crate::api::Error::new(
            ErrorKind::Auth,
            "invalid_token",
            "expired (run `vaultfs login --server S --email E` again)",
        );
        assert_eq!(
            Error::from(hinted)
                .to_string()
                .matches("vaultfs login")
                .count(),
            1
        );
    }
}
