//! TLS to PostgreSQL, as libpq spells it: `sslmode` = `disable`, `prefer` (the default),
//! `require`, `verify-ca` or `verify-full`, and `sslrootcert` = a PEM file of the CAs to trust
//! (or `system`, the default: the system's roots). Over rustls, the TLS stack the HTTP client
//! builds already.
//!
//! tokio-postgres knows only `disable`, `prefer` and `require`, and no `sslrootcert`: both are
//! taken off the address here and the checks of the certificate are ours to choose, as libpq's:
//! `prefer` and `require` encrypt without checking whom to (unless a CA file is given, then
//! `require` checks as `verify-ca`), `verify-ca` checks the chain to a trusted CA, `verify-full`
//! that and the host name.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, Error as TlsError, SignatureScheme};

use super::{DbError, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

/// How a connection is secured: the address's `sslmode` and `sslrootcert`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsOptions {
    pub mode: SslMode,
    /// `None`: the system's roots.
    pub root_cert: Option<PathBuf>,
}

fn mode(v: &str) -> Result<SslMode> {
    Ok(match v {
        "disable" => SslMode::Disable,
        // libpq's `allow` tries without TLS first; no server needs it from us.
        "allow" | "prefer" => SslMode::Prefer,
        "require" => SslMode::Require,
        "verify-ca" => SslMode::VerifyCa,
        "verify-full" => SslMode::VerifyFull,
        other => {
            return Err(DbError::Other(format!(
                "sslmode={other}: one of disable, prefer, require, verify-ca, verify-full"
            )));
        }
    })
}

/// The address without `sslmode` and `sslrootcert` (a URL's query parameters, or `key=value`
/// words), and what they said.
pub fn split_options(address: &str) -> Result<(String, TlsOptions)> {
    let mut tls = TlsOptions {
        mode: SslMode::Prefer,
        root_cert: None,
    };
    let mut take = |k: &str, v: &str| -> Result<bool> {
        match k {
            "sslmode" => tls.mode = mode(v)?,
            "sslrootcert" if v == "system" => tls.root_cert = None,
            "sslrootcert" => tls.root_cert = Some(PathBuf::from(v)),
            _ => return Ok(false),
        }
        Ok(true)
    };
    let rest = if address.starts_with("postgres://") || address.starts_with("postgresql://") {
        match address.split_once('?') {
            None => address.to_string(),
            Some((base, query)) => {
                let mut kept = Vec::new();
                for pair in query.split('&') {
                    let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                    let v = percent_encoding::percent_decode_str(v).decode_utf8_lossy();
                    if !take(k, &v)? {
                        kept.push(pair);
                    }
                }
                if kept.is_empty() {
                    base.to_string()
                } else {
                    format!("{base}?{}", kept.join("&"))
                }
            }
        }
    } else {
        let mut kept = Vec::new();
        for word in address.split_whitespace() {
            let (k, v) = word.split_once('=').unwrap_or((word, ""));
            if !take(k, v.trim_matches('\''))? {
                kept.push(word);
            }
        }
        kept.join(" ")
    };
    if tls.root_cert.is_some() && tls.mode == SslMode::Require {
        tls.mode = SslMode::VerifyCa;
    }
    Ok((rest, tls))
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// The CAs to trust: the file's, or the system's.
fn roots(file: Option<&PathBuf>) -> Result<rustls::RootCertStore> {
    let mut roots = rustls::RootCertStore::empty();
    match file {
        Some(path) => {
            let certs = CertificateDer::pem_file_iter(path)
                .and_then(|it| it.collect::<std::result::Result<Vec<_>, _>>())
                .map_err(|e| DbError::Other(format!("sslrootcert {}: {e}", path.display())))?;
            let (added, _) = roots.add_parsable_certificates(certs);
            if added == 0 {
                return Err(DbError::Other(format!(
                    "sslrootcert {}: no certificate in it",
                    path.display()
                )));
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            for e in &found.errors {
                log::warn!("reading the system's CA certificates: {e}");
            }
            roots.add_parsable_certificates(found.certs);
        }
    }
    Ok(roots)
}

/// The TLS connector of `tokio-postgres` for these options (`None`: no TLS at all).
pub fn connector(tls: &TlsOptions) -> Result<Option<tokio_postgres_rustls::MakeRustlsConnect>> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| DbError::Other(format!("TLS: {e}")))?;
    let verifier: Arc<dyn ServerCertVerifier> = match tls.mode {
        SslMode::Disable => return Ok(None),
        SslMode::Prefer | SslMode::Require => Arc::new(Unchecked(provider())),
        SslMode::VerifyCa | SslMode::VerifyFull => {
            let webpki = WebPkiServerVerifier::builder_with_provider(
                Arc::new(roots(tls.root_cert.as_ref())?),
                provider(),
            )
            .build()
            .map_err(|e| DbError::Other(format!("TLS: {e}")))?;
            if tls.mode == SslMode::VerifyCa {
                Arc::new(AnyName(webpki))
            } else {
                webpki
            }
        }
    };
    let config = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(Some(tokio_postgres_rustls::MakeRustlsConnect::new(config)))
}

/// `prefer` and `require`: encrypted, whoever the server is (libpq's meaning of them).
#[derive(Debug)]
struct Unchecked(Arc<CryptoProvider>);

/// `verify-ca`: the chain must lead to a trusted CA; the name in it is not checked.
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> std::result::Result<ServerCertVerified, TlsError> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, TlsError> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, TlsError> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, TlsError> {
        // The chain is checked before the name: a wrong name means a good chain.
        match self
            .0
            .verify_server_cert(end_entity, intermediates, name, ocsp, now)
        {
            Err(TlsError::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, TlsError> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, TlsError> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sslmode_and_sslrootcert_are_taken_off_the_address() {
        let (rest, tls) = split_options(
            "postgres://u@db.internal/v?application_name=x&sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem",
        )
        .unwrap();
        assert_eq!(rest, "postgres://u@db.internal/v?application_name=x");
        assert_eq!(tls.mode, SslMode::VerifyFull);
        assert_eq!(tls.root_cert, Some(PathBuf::from("/etc/ca.pem")));
        let (rest, tls) = split_options("postgres://u@h/v").unwrap();
        assert_eq!(
            (rest.as_str(), tls.mode),
            ("postgres://u@h/v", SslMode::Prefer)
        );
        let (rest, tls) = split_options("host=h user=u sslmode=require sslrootcert=/ca").unwrap();
        // A CA file given makes `require` check the chain, as libpq does.
        assert_eq!(
            (rest.as_str(), tls.mode),
            ("host=h user=u", SslMode::VerifyCa)
        );
        assert_eq!(
            split_options("postgres://h/v?sslmode=disable")
                .unwrap()
                .1
                .mode,
            SslMode::Disable
        );
        assert!(split_options("postgres://h/v?sslmode=maybe").is_err());
    }
}
