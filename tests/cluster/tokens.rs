//! Tokens on a shared store: a token found valid is taken at its word for a second at most
//! (checking it is a round trip to PostgreSQL, three times an upload), so a revocation made by
//! another server takes effect within that second, and one made by the same server at once.

use std::time::Duration;

use vaultfs::store::{Store, StoreConfig};

#[test]
fn a_revoked_token_is_refused_at_once_here_and_within_a_second_elsewhere() {
    let Some(pg) = crate::common::pg::pg() else {
        return;
    };
    let database = pg.database();
    let dir = tempfile::tempdir().unwrap();
    let open = |sub: &str| {
        let path = dir.path().join(sub);
        std::fs::create_dir_all(&path).unwrap();
        let config = StoreConfig {
            database: Some(database.clone()),
            ..StoreConfig::default()
        };
        Store::open(&path, config).unwrap()
    };
    // Two stores on one database: two servers.
    let (one, two) = (open("one"), open("two"));
    one.add_user("a@acme.test", "Acme", "pw-a").unwrap();
    let sign_in = || {
        one.sign_in_web("a@acme.test", "pw-a", "127.0.0.1")
            .unwrap()
            .token
    };

    // Revoked by the server that checked it: refused at the next request.
    let token = sign_in();
    assert_eq!(one.web_session(&token).unwrap().email, "a@acme.test");
    one.end_web_session(&token).unwrap();
    let refused = one.web_session(&token);
    assert!(refused.is_err(), "right after its revocation: {refused:?}");

    // Revoked by the other server: still taken within the second (remembered), refused after.
    let token = sign_in();
    assert!(one.web_session(&token).is_ok());
    two.end_web_session(&token).unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    let refused = one.web_session(&token);
    assert!(
        refused.is_err(),
        "a second after its revocation elsewhere: {refused:?}"
    );

    // Every token of the user, revoked elsewhere: the same.
    let token = sign_in();
    assert!(one.web_session(&token).is_ok());
    two.revoke_tokens("a@acme.test").unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    assert!(one.web_session(&token).is_err());
}
