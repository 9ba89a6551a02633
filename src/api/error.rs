//! The one error type of the interface, and the one table between its kinds and HTTP statuses.
//! The server turns an [`Error`] into a status and an error envelope; the client turns a status
//! and an envelope back into an [`Error`]; the mount turns it into an errno.

use std::borrow::Cow;
use std::fmt;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong, at the granularity callers act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// Malformed or missing parameter, bad path, length/checksum mismatch.
    BadRequest,
    /// Missing, invalid or expired token, or wrong pin.
    Auth,
    /// Outside the caller's account, or an operation on an account/vault that is not allowed.
    Forbidden,
    NotFound,
    /// Destination exists (replace `fail`), name taken by a node of the other kind, preview not ready.
    Conflict,
    MethodNotAllowed,
    /// Over a configured size limit.
    TooLarge,
    /// Wrong Content-Type on upload step 3.
    UnsupportedMedia,
    RangeNotSatisfiable,
    /// Too many failed pin or password attempts.
    TooManyRequests,
    /// The store's disk is full.
    InsufficientStorage,
    /// The server is at one of its limits (password checks, transfers): 503 with `Retry-After`.
    Unavailable,
    /// Client side: the server could not be reached or the connection broke.
    Network,
    /// A bug, an I/O failure, or an answer that makes no sense.
    Server,
}

impl ErrorKind {
    /// The HTTP status of DESIGN.md §2 for this kind.
    pub fn status(self) -> u16 {
        match self {
            ErrorKind::BadRequest => 400,
            ErrorKind::Auth => 401,
            ErrorKind::Forbidden => 403,
            ErrorKind::NotFound => 404,
            ErrorKind::MethodNotAllowed => 405,
            ErrorKind::Conflict => 409,
            ErrorKind::TooLarge => 413,
            ErrorKind::UnsupportedMedia => 415,
            ErrorKind::RangeNotSatisfiable => 416,
            ErrorKind::TooManyRequests => 429,
            ErrorKind::Server => 500,
            ErrorKind::Network => 502,
            ErrorKind::Unavailable => 503,
            ErrorKind::InsufficientStorage => 507,
        }
    }

    /// The kind a client infers from a status (and the error code, which can override it: the
    /// public service answers an invalid token with 400 `invalid_token`).
    pub fn from_status(status: u16, code: Option<&str>) -> ErrorKind {
        if matches!(code, Some("invalid_token" | "token_expired")) {
            return ErrorKind::Auth;
        }
        match status {
            401 => ErrorKind::Auth,
            403 => ErrorKind::Forbidden,
            404 | 410 => ErrorKind::NotFound,
            405 => ErrorKind::MethodNotAllowed,
            409 | 412 => ErrorKind::Conflict,
            413 => ErrorKind::TooLarge,
            415 => ErrorKind::UnsupportedMedia,
            416 => ErrorKind::RangeNotSatisfiable,
            429 => ErrorKind::TooManyRequests,
            507 => ErrorKind::InsufficientStorage,
            // A 503 (a server at its limits, with Retry-After) is retried like a network failure.
            502..=504 => ErrorKind::Network,
            400..=499 => ErrorKind::BadRequest,
            _ => ErrorKind::Server,
        }
    }

    /// The error code used when nothing more specific was given.
    pub fn default_code(self) -> &'static str {
        match self {
            ErrorKind::BadRequest => "bad_request",
            ErrorKind::Auth => "invalid_token",
            ErrorKind::Forbidden => "forbidden",
            ErrorKind::NotFound => "not_found",
            ErrorKind::MethodNotAllowed => "method_not_allowed",
            ErrorKind::Conflict => "conflict",
            ErrorKind::TooLarge => "too_large",
            ErrorKind::UnsupportedMedia => "unsupported_media_type",
            ErrorKind::RangeNotSatisfiable => "range_not_satisfiable",
            ErrorKind::TooManyRequests => "too_many_requests",
            ErrorKind::InsufficientStorage => "insufficient_storage",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Network => "network_error",
            ErrorKind::Server => "internal_error",
        }
    }
}

/// An error of the interface: a kind, a snake_case code and a sentence for people.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub kind: ErrorKind,
    pub code: Cow<'static, str>,
    pub message: String,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

impl Error {
    pub fn new(
        kind: ErrorKind,
        code: impl Into<Cow<'static, str>>,
        message: impl Into<String>,
    ) -> Self {
        Error {
            kind,
            code: code.into(),
            message: message.into(),
        }
    }
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::BadRequest, code, message)
    }
    pub fn bad_path(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::BadRequest, "bad_path", message)
    }
    pub fn missing(param: &str) -> Self {
        Self::new(
            ErrorKind::BadRequest,
            "missing_parameter",
            format!("missing parameter `{param}`"),
        )
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, "not_found", message)
    }
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Forbidden, "forbidden", message)
    }
    pub fn conflict(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Conflict, code, message)
    }
    pub fn auth(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Auth, code, message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Server, "internal_error", message)
    }
    pub fn status(&self) -> u16 {
        self.kind.status()
    }
    pub fn is(&self, kind: ErrorKind) -> bool {
        self.kind == kind
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        // A full disk is an answer the caller can act on (507 / ENOSPC), not a bug.
        match e.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => Error::new(
                ErrorKind::InsufficientStorage,
                "insufficient_storage",
                "the store's disk is full",
            ),
            _ => Error::internal(format!("I/O error: {e}")),
        }
    }
}
