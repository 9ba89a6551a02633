//! TLS to PostgreSQL as libpq's `sslmode` asks for it, against a real server with `ssl=on` and a
//! certificate of a CA made for the test (openssl): `verify-full` connects with that CA and
//! refuses without it, `verify-ca` does not check the name, `disable` does not encrypt.

use std::path::Path;

use vaultfs::store::db::{Engine, Value};

/// The test's CA and server certificate (`common::tls`), readable by the server.
fn make_certificates(dir: &Path) {
    crate::common::tls::make_certificates(dir);
    // The server runs as nobody and wants its key private.
    use std::os::unix::fs::PermissionsExt;
    for f in ["server.key", "server.crt"] {
        std::os::unix::fs::chown(dir.join(f), Some(65534), Some(65534)).unwrap();
    }
    std::fs::set_permissions(
        dir.join("server.key"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Whether the session at `url` is encrypted (the server's own view), or why it failed.
fn encrypted(url: String) -> Result<bool, String> {
    std::thread::spawn(move || {
        let conn = Engine::Postgres(url).connect().map_err(|e| e.to_string())?;
        let v: Value = conn
            .query_row(
                "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
                [],
                |r| r.get(0),
            )
            .map_err(|e| e.to_string())?;
        Ok(v == Value::Int(1))
    })
    .join()
    .expect("the connecting thread")
}

#[test]
fn sslmode_verifies_as_libpq_does() {
    let certs = tempfile::tempdir().unwrap();
    make_certificates(certs.path());
    let port = crate::common::free_port();
    let c = certs.path().display();
    let Some(_server) = crate::common::pg::own_with(
        port,
        &format!(
            "-c ssl=on -c ssl_cert_file={c}/server.crt -c ssl_key_file={c}/server.key \
             -c listen_addresses=127.0.0.1"
        ),
    ) else {
        return;
    };
    let at = |host: &str, options: &str| {
        format!("postgres://vaultfs@{host}:{port}/postgres?connect_timeout=10&{options}")
    };
    let ca = format!("sslrootcert={c}/ca.crt");

    // The certificate names localhost and leads to the test's CA: verified in full.
    assert_eq!(
        encrypted(at("localhost", &format!("sslmode=verify-full&{ca}"))),
        Ok(true)
    );
    // Without the CA (the system's roots only), the server is not trusted.
    let refused = encrypted(at("localhost", "sslmode=verify-full")).unwrap_err();
    assert!(refused.contains("certificate"), "{refused}");
    // 127.0.0.1 is not the name in the certificate: verify-full refuses, verify-ca does not
    // look at names.
    let wrong_name = encrypted(at("127.0.0.1", &format!("sslmode=verify-full&{ca}"))).unwrap_err();
    assert!(wrong_name.contains("certificate"), "{wrong_name}");
    assert_eq!(
        encrypted(at("127.0.0.1", &format!("sslmode=verify-ca&{ca}"))),
        Ok(true)
    );
    // require and prefer encrypt without checking; disable does not encrypt.
    assert_eq!(encrypted(at("127.0.0.1", "sslmode=require")), Ok(true));
    assert_eq!(encrypted(at("127.0.0.1", "sslmode=prefer")), Ok(true));
    assert_eq!(encrypted(at("127.0.0.1", "sslmode=disable")), Ok(false));
}
