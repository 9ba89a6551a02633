//! The JSON envelope every response is wrapped in (DESIGN.md §2): `{"error": {...}, "message": {...}}`.
//! This is the one place that builds it, for success and for failure.

use serde::{Deserialize, Serialize};

use super::error::{Error, ErrorKind};

/// `error` of the envelope: `success`, and on failure the code, text, request id and status.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ErrorObject {
    #[serde(default)]
    pub success: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_guid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_code: Option<u16>,
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
                error_code: Some(err.code.to_string()),
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
        let kind = ErrorKind::from_status(status, self.error.error_code.as_deref());
        let code = self
            .error
            .error_code
            .unwrap_or_else(|| kind.default_code().to_string());
        let text = self
            .error
            .error_text
            .unwrap_or_else(|| format!("the server answered {status} ({code})"));
        Err(Error::new(kind, code, text))
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
