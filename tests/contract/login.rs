//! The login flow: a pin exchanged for a token that the remote backend then uses.

use std::time::{Duration, SystemTime};

use vaultfs::api::ErrorKind;
use vaultfs::backend::Backend;
use vaultfs::backend::remote::RemoteBackend;
use vaultfs::cli::login;

use crate::common::TestServer;
use crate::{err, vault};

#[tokio::test(flavor = "multi_thread")]
async fn login_stores_a_token_that_the_remote_backend_uses() {
    let server = TestServer::start().await;
    server.store.add_user("a@acme.test", "Acme", "pw").unwrap();
    let pin = server
        .store
        .sign_in_for_pin("a@acme.test", "pw", login::CLIENT_ID, "")
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("vaultfs/credentials.toml");

    let url = format!("{}/", server.base);
    let wrong = login::exchange_pin(&url, "a@acme.test", login::CLIENT_ID, "11111111")
        .await
        .unwrap_err();
    assert!(wrong.contains("pin"), "{wrong}");
    let creds = login::exchange_pin(&url, "a@acme.test", login::CLIENT_ID, &pin)
        .await
        .unwrap();
    assert_eq!(
        (creds.server.as_str(), creds.email.as_str()),
        (server.base.as_str(), "a@acme.test")
    );
    let left = creds.expires_at.duration_since(SystemTime::now()).unwrap();
    assert!(left > Duration::from_secs(13 * 24 * 3600), "{left:?}");
    login::save_credentials(&file, &creds).unwrap();
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains(&server.base) && text.contains("a@acme.test"));

    let stored = login::credentials_in(&file, &server.base).unwrap();
    let b = RemoteBackend::new(stored.remote_config()).unwrap();
    assert_eq!(b.node(&vault()).await.unwrap().name, "My First Vault");

    // A revoked token: the error says what to do.
    server.store.revoke_tokens("a@acme.test").unwrap();
    let e = err(b.node(&vault()).await);
    assert_eq!(e.kind, ErrorKind::Auth);
    assert!(
        e.message.contains(&format!(
            "vaultfs login --server {} --email a@acme.test",
            server.base
        )),
        "{e}"
    );
    assert!(!e.message.contains(stored.token.expose()));

    assert!(login::remove_credentials(&file, &url).unwrap());
    let e = login::credentials_in(&file, &server.base).unwrap_err();
    assert!(e.contains("vaultfs login --server"), "{e}");
}
