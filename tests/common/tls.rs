//! TLS for tests: a CA made for the test and a server certificate it signed (openssl), as a
//! managed PostgreSQL or a reverse proxy in front of `vaultfs serve` would present.
#![allow(dead_code)]

use std::path::Path;
use std::process::Command;

/// A CA (`ca.crt`) and a certificate it signed for `localhost` only (`server.crt`,
/// `server.key`), made in `dir` by openssl.
pub fn make_certificates(dir: &Path) {
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("run openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    run(&[
        &["req", "-x509", "-days", "2", "-subj", "/CN=vaultfs test CA"][..],
        &ec,
        &["-keyout", "ca.key", "-out", "ca.crt"],
        &["-addext", "basicConstraints=critical,CA:TRUE"],
        &["-addext", "keyUsage=critical,keyCertSign,cRLSign"],
    ]
    .concat());
    run(&[
        &["req", "-subj", "/CN=localhost"][..],
        &ec,
        &["-keyout", "server.key", "-out", "server.csr"],
    ]
    .concat());
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
        "-out",
        "server.crt",
    ]);
}
