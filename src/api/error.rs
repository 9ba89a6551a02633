//! The one error type of the interface, and the one table between its kinds and HTTP statuses.
//! The server turns an [`Error`] into a status and an error envelope; the client turns a status
//! and an envelope back into an [`Error`]; the mount turns it into an errno.

use std::borrow::Cow;
use std::fmt;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The integer `error_code`s the public service documents (its developer pages), which our
/// server sends for the same cases. Every other error of our server carries
/// `own_code(status)`; the snake_case name travels beside it as `error_name`.
pub mod code {
    /// "Object not found."
    pub const NOT_FOUND: i64 = -520093684;
    /// The token (or pin) is not accepted: log in again.
    pub const AUTHORIZATION: i64 = -1593835519;
    /// "Object already exists" (the service sends it with HTTP 500).
    pub const ALREADY_EXISTS: i64 = -1593835510;
    /// The request body is malformed or lacks a parameter.
    pub const BAD_REQUEST_BODY: i64 = -2147467259;

    /// The code of one of our errors that the service documents no code for.
    pub const fn own_code(status: u16) -> i64 {
        -100_000 - status as i64
    }
}

/// The documented codes: what each means to a client, and the name it gets when a server sends
/// no `error_name`.
const DOCUMENTED: [(i64, ErrorKind, &str); 4] = [
    (code::NOT_FOUND, ErrorKind::NotFound, "not_found"),
    (code::AUTHORIZATION, ErrorKind::Auth, "invalid_token"),
    (code::ALREADY_EXISTS, ErrorKind::Conflict, "exists"),
    (code::BAD_REQUEST_BODY, ErrorKind::BadRequest, "bad_request"),
];

/// Names of errors that mean "log in again" whatever the status (the public service answers an
/// invalid token with 400).
const AUTH_NAMES: [&str; 2] = ["invalid_token", "token_expired"];

/// Names of bad requests that the documented "bad request body" code covers.
const BAD_BODY_NAMES: [&str; 3] = ["bad_json", "missing_parameter", "bad_parameter"];

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
    /// An upload's base no longer holds: another version became current since the edit began
    /// (`version_conflict`, our extension of the interface).
    Precondition,
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
    /// The HTTP status of docs/design.md §2 for this kind.
    pub fn status(self) -> u16 {
        match self {
            ErrorKind::BadRequest => 400,
            ErrorKind::Auth => 401,
            ErrorKind::Forbidden => 403,
            ErrorKind::NotFound => 404,
            ErrorKind::MethodNotAllowed => 405,
            ErrorKind::Conflict => 409,
            ErrorKind::Precondition => 412,
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

    /// The kind a client infers from an error: the code first (a documented integer, then a
    /// name), the status only when neither says more. "Already exists" comes with 500 from the
    /// public service and must not be retried as a server failure.
    pub fn classify(number: Option<i64>, name: Option<&str>, status: u16) -> ErrorKind {
        if let Some(&(_, kind, _)) = DOCUMENTED.iter().find(|d| Some(d.0) == number) {
            return kind;
        }
        if name.is_some_and(|n| AUTH_NAMES.contains(&n)) {
            return ErrorKind::Auth;
        }
        Self::from_status(status)
    }

    /// The kind a client infers from a status alone.
    pub fn from_status(status: u16) -> ErrorKind {
        match status {
            401 => ErrorKind::Auth,
            403 => ErrorKind::Forbidden,
            404 | 410 => ErrorKind::NotFound,
            405 => ErrorKind::MethodNotAllowed,
            409 => ErrorKind::Conflict,
            412 => ErrorKind::Precondition,
            413 => ErrorKind::TooLarge,
            415 => ErrorKind::UnsupportedMedia,
            416 => ErrorKind::RangeNotSatisfiable,
            429 => ErrorKind::TooManyRequests,
            507 => ErrorKind::InsufficientStorage,
            // A server at its limits (with Retry-After): retried like a network failure, and
            // EAGAIN, not EIO, when the retries run out.
            503 => ErrorKind::Unavailable,
            502 | 504 => ErrorKind::Network,
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
            ErrorKind::Precondition => "version_conflict",
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

/// An error of the interface: a kind, a snake_case code and a sentence for people; on the
/// client side also the integer code the server sent, when it sent one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub kind: ErrorKind,
    pub code: Cow<'static, str>,
    pub message: String,
    pub number: Option<i64>,
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
            number: None,
        }
    }

    /// The integer `error_code` of this error on the wire: the one a server sent, else the
    /// documented one for its case, else [`code::own_code`] of its status.
    pub fn wire_code(&self) -> i64 {
        if let Some(n) = self.number {
            return n;
        }
        let name = self.code.as_ref();
        match self.kind {
            ErrorKind::NotFound => code::NOT_FOUND,
            ErrorKind::Auth => code::AUTHORIZATION,
            _ if self.already_exists() => code::ALREADY_EXISTS,
            ErrorKind::BadRequest if BAD_BODY_NAMES.contains(&name) => code::BAD_REQUEST_BODY,
            kind => code::own_code(kind.status()),
        }
    }

    /// "Object already exists": the name is taken (by the documented code, or by our name).
    pub fn already_exists(&self) -> bool {
        self.number == Some(code::ALREADY_EXISTS)
            || (self.kind == ErrorKind::Conflict && self.code == "exists")
    }

    /// The error a server described: its integer and/or string code, `error_name`, text and the
    /// status it came with (see [`ErrorKind::classify`]). The server's text is kept as the message.
    pub fn from_server(
        number: Option<i64>,
        name: Option<String>,
        text: Option<String>,
        status: u16,
    ) -> Error {
        let kind = ErrorKind::classify(number, name.as_deref(), status);
        let code: Cow<'static, str> = match name {
            Some(n) => n.into(),
            None => DOCUMENTED
                .iter()
                .find(|d| Some(d.0) == number)
                .map_or(kind.default_code(), |d| d.2)
                .into(),
        };
        let message = text
            .filter(|t| !t.trim().is_empty())
            .unwrap_or_else(|| match number {
                Some(n) => format!("the server answered {status} (error {n}, {code})"),
                None => format!("the server answered {status} ({code})"),
            });
        Error {
            kind,
            code,
            message,
            number,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The code decides before the status: "exists" with 500 is a conflict, not a server failure.
    #[test]
    fn classified_by_code_before_status() {
        let e = |n: Option<i64>, name: Option<&str>, status| {
            Error::from_server(n, name.map(String::from), None, status)
        };
        let exists = e(Some(code::ALREADY_EXISTS), None, 500);
        assert_eq!(
            (exists.kind, exists.code.as_ref()),
            (ErrorKind::Conflict, "exists")
        );
        assert_eq!(
            e(Some(code::NOT_FOUND), None, 500).kind,
            ErrorKind::NotFound
        );
        assert_eq!(
            e(Some(code::AUTHORIZATION), None, 400).kind,
            ErrorKind::Auth
        );
        assert_eq!(
            e(Some(code::BAD_REQUEST_BODY), None, 500).kind,
            ErrorKind::BadRequest
        );
        assert_eq!(e(None, Some("invalid_token"), 400).kind, ErrorKind::Auth);
        assert_eq!(e(Some(-7), None, 503).kind, ErrorKind::Unavailable);
        assert_eq!(e(Some(-7), None, 502).kind, ErrorKind::Network);
        assert_eq!(e(Some(-7), None, 500).kind, ErrorKind::Server);
        let named = e(Some(code::own_code(409)), Some("preview_not_ready"), 409);
        assert_eq!(
            (named.kind, named.code.as_ref()),
            (ErrorKind::Conflict, "preview_not_ready")
        );
        assert!(named.message.contains("409"), "{}", named.message);
    }

    /// What our server sends back turns into the same kind and name on the client.
    #[test]
    fn wire_codes_round_trip() {
        for err in [
            Error::not_found("x"),
            Error::auth("token_expired", "x"),
            Error::conflict("exists", "x"),
            Error::conflict("preview_not_ready", "x"),
            Error::missing("length"),
            Error::bad_request("checksum_mismatch", "x"),
            Error::forbidden("x"),
            Error::new(ErrorKind::TooManyRequests, "too_many_attempts", "x"),
        ] {
            let back = Error::from_server(
                Some(err.wire_code()),
                Some(err.code.to_string()),
                Some(err.message.clone()),
                err.status(),
            );
            assert_eq!((back.kind, &back.code), (err.kind, &err.code), "{err:?}");
        }
        assert_eq!(Error::missing("x").wire_code(), code::BAD_REQUEST_BODY);
        assert_eq!(Error::forbidden("x").wire_code(), -100_403);
    }
}
