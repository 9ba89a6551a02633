//! The request's ID: made by the request context (`context.rs`) for each request, and read by
//! whatever names the request, such as an error's `instance_guid` (`reply.rs`) and the log
//! lines. Its own file below both, so that the context (which answers with errors) and the
//! reply (which names the request) do not import each other.

use std::future::Future;

tokio::task_local! {
    static REQUEST_ID: String;
}

/// The id of the request being handled ("-" outside one).
pub fn request_id() -> String {
    REQUEST_ID
        .try_with(Clone::clone)
        .unwrap_or_else(|_| "-".to_string())
}

/// Runs `f` as the request `id`: [`request_id`] inside it says `id`.
pub async fn scope<F: Future>(id: String, f: F) -> F::Output {
    REQUEST_ID.scope(id, f).await
}
