//! Where a bucket is: `s3://BUCKET/PREFIX`, `gs://BUCKET/PREFIX` or `az://CONTAINER/PREFIX`,
//! and for S3 the endpoint of an S3-compatible service.

/// The service a bucket is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    /// Amazon S3 or an S3-compatible service (MinIO, Ceph, Garage...).
    S3,
    /// Google Cloud Storage.
    Gcs,
    /// Azure Blob Storage (the account from `AZURE_STORAGE_ACCOUNT_NAME`).
    Azure,
}

impl Service {
    fn scheme(self) -> &'static str {
        match self {
            Service::S3 => "s3",
            Service::Gcs => "gs",
            Service::Azure => "az",
        }
    }
}

/// Where blobs go: a bucket (or Azure container), a prefix in it, and for S3 the endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketLocation {
    pub service: Service,
    pub bucket: String,
    /// Empty, or ends with `/`.
    pub prefix: String,
    /// `http(s)://host[:port]` of an S3-compatible service; `None`: the service's own (for S3
    /// the region's endpoint, or `AWS_ENDPOINT_URL_S3` / `AWS_ENDPOINT_URL` when set).
    pub endpoint: Option<String>,
}

impl BucketLocation {
    /// `s3://BUCKET[/PREFIX]`, `gs://...` or `az://...`; `None` for anything that is not such
    /// a URL.
    pub fn parse(s: &str, endpoint: Option<&str>) -> Option<Result<BucketLocation, String>> {
        let (service, rest) = [Service::S3, Service::Gcs, Service::Azure]
            .into_iter()
            .find_map(|sv| Some((sv, s.strip_prefix(sv.scheme())?.strip_prefix("://")?)))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        // The names all three services accept (S3's rule, which is the narrowest).
        if bucket.is_empty()
            || !bucket
                .bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b".-".contains(&c))
        {
            return Some(Err(format!("{s}: not a bucket name")));
        }
        if endpoint.is_some() && service != Service::S3 {
            return Some(Err(format!("{s}: an endpoint is for s3:// only")));
        }
        let prefix = prefix.trim_matches('/');
        Some(Ok(BucketLocation {
            service,
            bucket: bucket.to_string(),
            prefix: if prefix.is_empty() {
                String::new()
            } else {
                format!("{prefix}/")
            },
            endpoint: endpoint.map(|e| e.trim_end_matches('/').to_string()),
        }))
    }
}

impl std::fmt::Display for BucketLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}://{}/{}",
            self.service.scheme(),
            self.bucket,
            self.prefix
        )?;
        if let Some(e) = &self.endpoint {
            write!(f, " at {e}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations() {
        let l = BucketLocation::parse("s3://docs/vault/a/", Some("http://127.0.0.1:9000/"))
            .unwrap()
            .unwrap();
        assert_eq!((l.service, l.bucket.as_str()), (Service::S3, "docs"));
        assert_eq!(l.prefix, "vault/a/");
        assert_eq!(l.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
        assert_eq!(l.to_string(), "s3://docs/vault/a/ at http://127.0.0.1:9000");
        assert_eq!(
            BucketLocation::parse("s3://b", None)
                .unwrap()
                .unwrap()
                .prefix,
            ""
        );
        let g = BucketLocation::parse("gs://b/p", None).unwrap().unwrap();
        assert_eq!((g.service, g.prefix.as_str()), (Service::Gcs, "p/"));
        let a = BucketLocation::parse("az://c", None).unwrap().unwrap();
        assert_eq!(a.service, Service::Azure);
        assert!(
            BucketLocation::parse("gs://b", Some("http://x"))
                .unwrap()
                .is_err()
        );
        assert!(BucketLocation::parse("s3://", None).unwrap().is_err());
        assert!(
            BucketLocation::parse("s3://Bad_Name/x", None)
                .unwrap()
                .is_err()
        );
        assert!(BucketLocation::parse("/var/blobs", None).is_none());
        assert!(BucketLocation::parse("s3x://b", None).is_none());
    }
}
