//! The JSON envelope every response is wrapped in (docs/design.md §2): `{"error": {...}, "message": {...}}`.
//! This is the one place that builds it, for success and for failure.

use serde::{Deserialize, Serialize};

use super::error::Error;

/// `error` of the envelope: `success`, and on failure the code (an integer, as the public
/// service documents; our server adds the snake_case `error_name`), text, request id and status.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ErrorObject {
    #[serde(default)]
    pub success: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<WireCode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_guid: Option<String>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "super::types::lenient_number"
    )]
    pub status_code: Option<u16>,
}

/// `error_code` as servers send it: an integer (the public service), a string of digits, or a
/// name (`"not_found"`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum WireCode {
    Number(i64),
    Text(String),
}

impl WireCode {
    /// The integer, also when it came as a string.
    pub fn number(&self) -> Option<i64> {
        match self {
            WireCode::Number(n) => Some(*n),
            WireCode::Text(t) => t.trim().parse().ok(),
        }
    }

    /// The name, when the code is one (not digits).
    pub fn name(&self) -> Option<&str> {
        match self {
            WireCode::Text(t) if self.number().is_none() && !t.trim().is_empty() => Some(t.trim()),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Envelope<T> {
    #[serde(default)]
    pub error: ErrorObject,
    #[serde(default = "none", skip_serializing_if = "Option::is_none")]
    pub message: Option<T>,
}

fn none<T>() -> Option<T> {
    None
}

impl<T> Envelope<T> {
    /// A successful envelope carrying `message`.
    pub fn ok(message: T) -> Self {
        Envelope {
            error: ErrorObject {
                success: true,
                ..Default::default()
            },
            message: Some(message),
        }
    }

    /// The envelope of a failure, tagged with the request id.
    pub fn failure(err: &Error, instance_guid: &str) -> Self {
        Envelope {
            error: ErrorObject {
                success: false,
                error_code: Some(WireCode::Number(err.wire_code())),
                error_name: Some(err.code.to_string()),
                error_text: Some(err.message.clone()),
                instance_guid: Some(instance_guid.to_string()),
                status_code: Some(err.status()),
            },
            message: None,
        }
    }

    /// Client side: the message of a successful envelope, or the error it carries. `status` is the
    /// HTTP status the envelope came with; success is decided by `error.success`.
    pub fn into_result(self, status: u16) -> Result<Option<T>, Error> {
        if self.error.success {
            return Ok(self.message);
        }
        let status = if (200..300).contains(&status) {
            self.error.status_code.unwrap_or(500)
        } else {
            status
        };
        let e = self.error;
        let number = e.error_code.as_ref().and_then(WireCode::number);
        let name = e.error_name.filter(|n| !n.trim().is_empty()).or_else(|| {
            e.error_code
                .as_ref()
                .and_then(|c| c.name().map(String::from))
        });
        Err(Error::from_server(number, name, e.error_text, status))
    }
}

/// The default success object: `{"error": {"success": true}}`.
pub fn success() -> Envelope<()> {
    Envelope {
        error: ErrorObject {
            success: true,
            ..Default::default()
        },
        message: None,
    }
}
