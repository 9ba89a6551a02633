//! The `Range: bytes=` header: the one parser, used by the server, and the form the client sends.
//! One range per request; a multi-range or malformed header is 416, as docs/design.md §2 decides.

use std::fmt;

use super::error::{Error, ErrorKind, Result};

/// A single byte range as asked, before the size of the file is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeRequest {
    /// `bytes=start-` or `bytes=start-end` (end inclusive).
    From { start: u64, end: Option<u64> },
    /// `bytes=-n`: the last n bytes.
    Suffix(u64),
}

fn unsatisfiable(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::RangeNotSatisfiable, "bad_range", msg)
}

impl RangeRequest {
    /// Parses a `Range` header value.
    pub fn parse(header: &str) -> Result<RangeRequest> {
        let spec = header
            .trim()
            .strip_prefix("bytes=")
            .ok_or_else(|| unsatisfiable("only `bytes=` ranges are supported"))?
            .trim();
        if spec.contains(',') {
            return Err(unsatisfiable("only one range per request is supported"));
        }
        let (a, b) = spec
            .split_once('-')
            .ok_or_else(|| unsatisfiable("malformed range"))?;
        let num = |s: &str| -> Result<u64> {
            let s = s.trim();
            if s.is_empty() || !s.bytes().all(|c| c.is_ascii_digit()) {
                return Err(unsatisfiable("malformed range"));
            }
            s.parse().map_err(|_| unsatisfiable("range out of bounds"))
        };
        if a.trim().is_empty() {
            return Ok(RangeRequest::Suffix(num(b)?));
        }
        let start = num(a)?;
        let end = if b.trim().is_empty() {
            None
        } else {
            Some(num(b)?)
        };
        if let Some(end) = end {
            if end < start {
                return Err(unsatisfiable("range ends before it starts"));
            }
        }
        Ok(RangeRequest::From { start, end })
    }

    /// A range for `len` bytes from `offset`.
    pub fn span(offset: u64, len: u64) -> RangeRequest {
        RangeRequest::From {
            start: offset,
            end: Some(offset + len.max(1) - 1),
        }
    }

    /// The inclusive `(first, last)` bytes this range covers in a file of `size` bytes.
    pub fn resolve(self, size: u64) -> Result<(u64, u64)> {
        match self {
            RangeRequest::From { start, end } => {
                if start >= size {
                    return Err(unsatisfiable(format!(
                        "range starts at {start}, past the end ({size} bytes)"
                    )));
                }
                Ok((start, end.map_or(size - 1, |e| e.min(size - 1))))
            }
            RangeRequest::Suffix(n) => {
                if n == 0 || size == 0 {
                    return Err(unsatisfiable("empty suffix range"));
                }
                Ok((size - n.min(size), size - 1))
            }
        }
    }
}

impl fmt::Display for RangeRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RangeRequest::From {
                start,
                end: Some(end),
            } => write!(f, "bytes={start}-{end}"),
            RangeRequest::From { start, end: None } => write!(f, "bytes={start}-"),
            RangeRequest::Suffix(n) => write!(f, "bytes=-{n}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_resolves() {
        let r = |h: &str, size| RangeRequest::parse(h).and_then(|r| r.resolve(size));
        assert_eq!(r("bytes=0-9", 100).unwrap(), (0, 9));
        assert_eq!(r("bytes=90-", 100).unwrap(), (90, 99));
        assert_eq!(r("bytes=90-200", 100).unwrap(), (90, 99));
        assert_eq!(r("bytes=-10", 100).unwrap(), (90, 99));
        assert_eq!(r("bytes=-1000", 100).unwrap(), (0, 99));
        for bad in [
            "bytes=100-",
            "bytes=5-4",
            "bytes=0-1,3-4",
            "items=0-1",
            "bytes=a-b",
            "bytes=-0",
            "bytes=-",
            "bytes=1",
        ] {
            assert_eq!(
                r(bad, 100).unwrap_err().kind,
                ErrorKind::RangeNotSatisfiable,
                "{bad}"
            );
        }
        assert!(r("bytes=0-", 0).is_err());
        let span = RangeRequest::span(10, 5);
        assert_eq!(span.to_string(), "bytes=10-14");
        assert_eq!(RangeRequest::parse(&span.to_string()).unwrap(), span);
    }
}
