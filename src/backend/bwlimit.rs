//! `--bwlimit`: one token bucket per direction, shared by every transfer of a mount, applied to
//! the byte streams themselves (upload bodies as they are sent, download bodies as they are
//! read), so the limit holds however many transfers run at once.
//!
//! A transfer reserves its bytes before they go and waits out the debt, in pieces of at most
//! `PIECE` bytes so a slow limit still shows progress (no idle timeout fires between pieces).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;

use super::ByteStream;
use crate::sync::relock;

/// Largest piece of a chunk sent or handed on at once.
const PIECE: usize = 64 << 10;

/// Bytes a second, with a burst of an eighth of a second (at least one piece).
#[derive(Debug)]
pub struct Bucket {
    rate: f64,
    burst: f64,
    /// Tokens (bytes that may go now; negative: owed) and when they were counted.
    state: Mutex<(f64, Instant)>,
}

impl Bucket {
    pub fn new(bytes_per_second: u64) -> Arc<Bucket> {
        let rate = bytes_per_second.max(1) as f64;
        let burst = (rate / 8.0).max(PIECE as f64);
        Arc::new(Bucket {
            rate,
            burst,
            state: Mutex::new((burst, Instant::now())),
        })
    }

    /// Reserves `n` bytes at `now`: how long to wait before sending them.
    fn reserve_at(&self, n: usize, now: Instant) -> Duration {
        let mut s = relock(&self.state);
        let elapsed = now.saturating_duration_since(s.1).as_secs_f64();
        s.0 = (s.0 + elapsed * self.rate).min(self.burst) - n as f64;
        s.1 = s.1.max(now);
        if s.0 >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-s.0 / self.rate)
        }
    }

    async fn take(&self, n: usize) {
        let wait = self.reserve_at(n, Instant::now());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

/// `body` at most as fast as `bucket` lets bytes through (unchanged without one).
pub fn limited(body: ByteStream, bucket: Option<Arc<Bucket>>) -> ByteStream {
    let Some(bucket) = bucket else {
        return body;
    };
    let pieces = body.flat_map(|item| {
        let items: Vec<std::io::Result<Bytes>> = match item {
            Ok(mut b) => {
                let mut v = Vec::new();
                while b.len() > PIECE {
                    v.push(Ok(b.split_to(PIECE)));
                }
                v.push(Ok(b));
                v
            }
            Err(e) => vec![Err(e)],
        };
        futures_util::stream::iter(items)
    });
    Box::pin(pieces.then(move |item| {
        let bucket = bucket.clone();
        async move {
            if let Ok(b) = &item {
                bucket.take(b.len()).await;
            }
            item
        }
    }))
}

/// `--bwlimit` in rclone's spelling: `10M` both ways, `1M:5M` upload:download (bytes a second,
/// suffixes K, M, G; `off` or 0 for no limit on a side).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BwLimit {
    pub upload: Option<u64>,
    pub download: Option<u64>,
}

impl BwLimit {
    pub fn parse(s: &str, size: impl Fn(&str) -> Result<u64, String>) -> Result<BwLimit, String> {
        let side = |v: &str| -> Result<Option<u64>, String> {
            match v.trim() {
                "off" | "" => Ok(None),
                v => Ok(Some(size(v)?).filter(|n| *n > 0)),
            }
        };
        match s.split_once(':') {
            Some((up, down)) => Ok(BwLimit {
                upload: side(up)?,
                download: side(down)?,
            }),
            None => {
                let both = side(s)?;
                Ok(BwLimit {
                    upload: both,
                    download: both,
                })
            }
        }
    }

    /// The buckets of uploads and of downloads.
    pub fn buckets(&self) -> (Option<Arc<Bucket>>, Option<Arc<Bucket>>) {
        (self.upload.map(Bucket::new), self.download.map(Bucket::new))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bucket_lets_a_burst_through_then_the_rate() {
        let b = Bucket::new(1 << 20); // burst: 128 KiB
        let t0 = Instant::now();
        assert_eq!(b.reserve_at(128 << 10, t0), Duration::ZERO);
        // 1 MiB more owes a second.
        let w = b.reserve_at(1 << 20, t0);
        assert!((w.as_secs_f64() - 1.0).abs() < 0.01, "{w:?}");
        // Half a second later, half a MiB is still owed, plus what is asked now.
        let w = b.reserve_at(256 << 10, t0 + Duration::from_millis(500));
        assert!((w.as_secs_f64() - 0.75).abs() < 0.01, "{w:?}");
        // Idle for long: only the burst builds up, not more.
        let later = t0 + Duration::from_secs(60);
        assert_eq!(b.reserve_at(128 << 10, later), Duration::ZERO);
        let w = b.reserve_at(64 << 10, later);
        assert!((w.as_secs_f64() - 1.0 / 16.0).abs() < 0.01, "{w:?}");
    }

    #[tokio::test]
    async fn a_limited_stream_goes_at_the_rate_and_keeps_its_bytes() {
        let data: Vec<u8> = (0..(1 << 20) + 12345).map(|i| (i % 251) as u8).collect();
        let chunks: Vec<std::io::Result<Bytes>> = data
            .chunks(300 << 10)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        let rate = 2 << 20;
        let started = Instant::now();
        let mut s = limited(
            Box::pin(futures_util::stream::iter(chunks)),
            Some(Bucket::new(rate)),
        );
        let mut got = Vec::new();
        while let Some(b) = s.next().await {
            let b = b.unwrap();
            assert!(b.len() <= PIECE);
            got.extend_from_slice(&b);
        }
        assert_eq!(got, data);
        // (1 MiB + 12 KiB - the 256 KiB burst) at 2 MiB/s: about 0.38 s.
        let took = started.elapsed().as_secs_f64();
        let expected = (data.len() as f64 - (rate / 8) as f64) / rate as f64;
        assert!(took >= expected * 0.9 && took < expected + 1.0, "{took} s");
    }

    #[test]
    fn rclone_spelling() {
        let size = |s: &str| {
            s.trim_end_matches('M')
                .parse::<u64>()
                .map(|n| n << 20)
                .map_err(|e| e.to_string())
        };
        let both = BwLimit::parse("10M", size).unwrap();
        assert_eq!(
            (both.upload, both.download),
            (Some(10 << 20), Some(10 << 20))
        );
        let split = BwLimit::parse("1M:5M", size).unwrap();
        assert_eq!(
            (split.upload, split.download),
            (Some(1 << 20), Some(5 << 20))
        );
        let up = BwLimit::parse("1M:off", size).unwrap();
        assert_eq!((up.upload, up.download), (Some(1 << 20), None));
        assert!(BwLimit::parse("fast", size).is_err());
    }
}
