//! The one table from interface errors to errno (docs/design.md §3).

use fuser::Errno;

use crate::api::{Error, ErrorKind};

/// The errno a failed backend call surfaces as.
pub fn errno(e: &Error) -> Errno {
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
        ErrorKind::Auth => {
            log::error!("the server refused our token: {e} (run `vaultfs login` again)");
            Errno::EACCES
        }
        ErrorKind::BadRequest | ErrorKind::RangeNotSatisfiable | ErrorKind::UnsupportedMedia => {
            Errno::EINVAL
        }
        ErrorKind::MethodNotAllowed => Errno::ENOTSUP,
        ErrorKind::TooLarge => Errno::EFBIG,
        ErrorKind::InsufficientStorage => Errno::ENOSPC,
        ErrorKind::TooManyRequests | ErrorKind::Unavailable => Errno::EAGAIN,
        // The uploader keeps a conflicting edit beside the other version; one that reaches a
        // caller is a failure to store.
        ErrorKind::Precondition | ErrorKind::Network | ErrorKind::Server => {
            log::warn!("backend failure: {e}");
            Errno::EIO
        }
    }
}

/// errno of a local I/O error (staging files, cache).
pub fn io_errno(e: &std::io::Error) -> Errno {
    e.raw_os_error().map(Errno::from_i32).unwrap_or(Errno::EIO)
}

/// Whether an upload that failed this way may succeed later (keep retrying) or never will.
pub fn is_transient(e: &Error) -> bool {
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
