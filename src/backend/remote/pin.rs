//! The pin exchange of docs/design.md §2 (no `Authorization` header).

use reqwest::Method;

use super::RemoteBackend;
use super::transport::{Req, Retry};
use crate::api::{PinAuthResponse, PinEndResponse, Result};

impl RemoteBackend {
    /// `POST /pin/end`: the URL where the user authorizes `client_id` and is shown the pin.
    pub async fn pin_end(&self, client_id: &str) -> Result<String> {
        let body = serde_json::json!({ "client_id": client_id });
        let req = Req::with_body(Method::POST, "/pin/end".into(), &body, Retry::Idempotent);
        let r: PinEndResponse = self.call_message(req.anonymous()).await?;
        Ok(r.authorization_uri)
    }

    /// `POST /pin/auth`: exchanges the pin for a delegation token (not retried once sent: each
    /// exchange issues a token, and failures count towards the lockout).
    pub async fn pin_auth(
        &self,
        email: &str,
        client_id: &str,
        pin: &str,
    ) -> Result<PinAuthResponse> {
        let pin = pin.trim();
        // A number on the wire (docs/design.md §2), leading zeros and all: a server that issues such
        // pins compares numbers. Only what is no number at all goes as it is.
        let pin_value = match pin.parse::<u64>() {
            Ok(n) => serde_json::json!(n),
            Err(_) => serde_json::json!(pin),
        };
        let body = serde_json::json!({
            "user_email": email,
            "pin_info": { "client_id": client_id, "pin": pin_value },
        });
        let req = Req::with_body(Method::POST, "/pin/auth".into(), &body, Retry::UnsentOnly);
        self.call_message(req.anonymous()).await
    }
}
