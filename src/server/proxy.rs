//! The client's address behind the reverse proxies the operator names (`--trusted-proxy`), and
//! the key the sign-in lockout counts it by.
//!
//! Each proxy appends the address it got a request from to `X-Forwarded-For` (or adds a
//! `Forwarded: for=` element, as `--proxy-header` says), so the list is read from the right,
//! past the trusted proxies: the first address that is not one is the client. Whatever is left
//! of it was written by the client itself and is never believed, nor is any such header of a
//! request that does not come from a trusted proxy. Only the header named is read: a proxy
//! that sets one passes the other through as the client sent it.

use std::net::IpAddr;
use std::str::FromStr;

use axum::http::HeaderMap;

/// An address block, `ADDR/BITS` (a bare address is the block of that one address).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    net: IpAddr,
    bits: u8,
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Cidr, String> {
        let (addr, bits) = match s.split_once('/') {
            Some((a, b)) => (a, Some(b)),
            None => (s, None),
        };
        let net: IpAddr = addr
            .parse()
            .map_err(|_| format!("`{s}` is not an address or ADDR/BITS"))?;
        let net = net.to_canonical();
        let max = if net.is_ipv4() { 32 } else { 128 };
        let bits = match bits {
            None => max,
            Some(b) => b
                .parse::<u8>()
                .ok()
                .filter(|b| *b <= max)
                .ok_or_else(|| format!("`{s}`: the prefix length is 0 to {max}"))?,
        };
        Ok(Cidr { net, bits })
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.net, self.bits)
    }
}

/// The first `bits` bits of an address, as a number (IPv4 in the low 32 bits).
fn prefix(ip: IpAddr, bits: u8) -> u128 {
    let (n, width) = match ip {
        IpAddr::V4(a) => (u128::from(u32::from(a)), 32),
        IpAddr::V6(a) => (u128::from(a), 128),
    };
    match width - u32::from(bits) {
        128 => 0,
        shift => n >> shift,
    }
}

impl Cidr {
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        ip.is_ipv4() == self.net.is_ipv4() && prefix(ip, self.bits) == prefix(self.net, self.bits)
    }
}

/// The header trusted proxies say the client's address in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProxyHeader {
    /// `X-Forwarded-For: client, proxy1, ...` (nginx's `$proxy_add_x_forwarded_for`).
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client, for=proxy1`.
    Forwarded,
}

impl FromStr for ProxyHeader {
    type Err = String;

    fn from_str(s: &str) -> Result<ProxyHeader, String> {
        match s.to_ascii_lowercase().as_str() {
            "x-forwarded-for" => Ok(ProxyHeader::XForwardedFor),
            "forwarded" => Ok(ProxyHeader::Forwarded),
            _ => Err(format!("`{s}`: x-forwarded-for or forwarded")),
        }
    }
}

/// The client of a request that came from `peer` with `headers`: `peer` itself unless it is a
/// trusted proxy; else the right-most address of the forwarding list that is not a trusted
/// proxy. When the list runs out, or holds something that is not an address there (`unknown`,
/// an obfuscated name), the last trusted hop is what is known.
pub fn client(peer: IpAddr, headers: &HeaderMap, trusted: &[Cidr], header: ProxyHeader) -> IpAddr {
    let peer = peer.to_canonical();
    let is_trusted = |ip: IpAddr| trusted.iter().any(|c| c.contains(ip));
    if !is_trusted(peer) {
        return peer;
    }
    let (name, parse): (_, fn(&str) -> Option<IpAddr>) = match header {
        ProxyHeader::XForwardedFor => ("x-forwarded-for", |e| node(e)),
        ProxyHeader::Forwarded => ("forwarded", forwarded_for),
    };
    // Every line of the header in order, each a comma-separated list (RFC 9110 5.3).
    let entries: Vec<&str> = headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .collect();
    let mut client = peer;
    for e in entries.iter().rev() {
        match parse(e) {
            Some(ip) => {
                client = ip.to_canonical();
                if !is_trusted(client) {
                    break;
                }
            }
            None => break,
        }
    }
    client
}

/// The `for=` of one element of `Forwarded` (`for=192.0.2.60;proto=http;by=203.0.113.43`).
fn forwarded_for(element: &str) -> Option<IpAddr> {
    element.split(';').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        k.trim().eq_ignore_ascii_case("for").then(|| node(v))?
    })
}

/// An address as forwarding headers write it: bare, quoted, IPv6 in brackets, with a port.
fn node(s: &str) -> Option<IpAddr> {
    let s = s.trim().trim_matches('"');
    if let Some(rest) = s.strip_prefix('[') {
        return rest.split_once(']')?.0.parse().ok();
    }
    if let Ok(ip) = s.parse() {
        return Some(ip);
    }
    // `192.0.2.60:4711`: an IPv4 address with a port (an IPv6 one has brackets then).
    let (addr, port) = s.rsplit_once(':')?;
    port.parse::<u16>().ok()?;
    addr.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4)
}

/// What the sign-in lockout counts a client by: an IPv4 address whole, an IPv6 address by its
/// /64 (one subscriber's network: a host picks any of its 2^64 addresses freely).
pub fn source_key(ip: IpAddr) -> String {
    match ip.to_canonical() {
        IpAddr::V4(a) => a.to_string(),
        IpAddr::V6(a) => {
            let net = std::net::Ipv6Addr::from(u128::from(a) >> 64 << 64);
            format!("{net}/64")
        }
    }
}

/// The last value of header `name`: the hop nearest this server, a trusted proxy's own.
pub fn last_hop(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .next_back()
        .map(|s| s.trim().to_string())
}

/// `key` of the last hop's `Forwarded` (RFC 7239), unquoted.
pub fn forwarded(headers: &HeaderMap, key: &str) -> Option<String> {
    last_hop(headers, "forwarded")?.split(';').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case(key)
            .then(|| v.trim().trim_matches('"').to_string())
    })
}

/// The scheme the client used as a proxy says it (`X-Forwarded-Proto`, else `Forwarded`'s
/// `proto`), lowercase; only for a request from a trusted proxy.
pub fn forwarded_proto(headers: &HeaderMap) -> Option<String> {
    last_hop(headers, "x-forwarded-proto")
        .or_else(|| forwarded(headers, "proto"))
        .map(|p| p.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn headers(name: &str, values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(
                axum::http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn blocks_hold_what_they_say() {
        let c: Cidr = "10.1.0.0/16".parse().unwrap();
        assert!(c.contains(ip("10.1.255.3")));
        assert!(c.contains(ip("::ffff:10.1.0.1")));
        assert!(!c.contains(ip("10.2.0.1")));
        assert!(!c.contains(ip("::a01:1")));
        let one: Cidr = "127.0.0.1".parse().unwrap();
        assert!(one.contains(ip("127.0.0.1")) && !one.contains(ip("127.0.0.2")));
        let all: Cidr = "::/0".parse().unwrap();
        assert!(all.contains(ip("2001:db8::1")) && !all.contains(ip("1.2.3.4")));
        let v6: Cidr = "fd00::/8".parse().unwrap();
        assert!(v6.contains(ip("fd12::1")) && !v6.contains(ip("fe80::1")));
        for bad in ["10.0.0.0/33", "::/129", "nginx", "10.0.0.0/x", ""] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
    }

    #[test]
    fn the_client_is_the_right_most_address_not_trusted() {
        let trusted: Vec<Cidr> = vec!["127.0.0.1".parse().unwrap(), "10.0.0.0/8".parse().unwrap()];
        let xff = ProxyHeader::XForwardedFor;
        let from = |peer: &str, values: &[&str]| {
            client(ip(peer), &headers("x-forwarded-for", values), &trusted, xff)
        };
        // Straight from a client: its own address, whatever it claims.
        assert_eq!(from("192.0.2.7", &["203.0.113.9"]), ip("192.0.2.7"));
        // Through the proxy: what it appended, not what the client wrote before it.
        assert_eq!(
            from("127.0.0.1", &["203.0.113.9, 198.51.100.4"]),
            ip("198.51.100.4")
        );
        // Through two trusted proxies, over two header lines.
        assert_eq!(
            from("127.0.0.1", &["6.6.6.6, 198.51.100.4", "10.1.2.3"]),
            ip("198.51.100.4")
        );
        // No header, or garbage right after the trusted hops: the last trusted hop.
        assert_eq!(from("127.0.0.1", &[]), ip("127.0.0.1"));
        assert_eq!(from("127.0.0.1", &["unknown, 10.0.0.5"]), ip("10.0.0.5"));
        // Forms with ports and brackets.
        assert_eq!(from("127.0.0.1", &["192.0.2.1:4711"]), ip("192.0.2.1"));
        assert_eq!(from("127.0.0.1", &["[2001:db8::1]:80"]), ip("2001:db8::1"));
        // Forwarded is read only when named, and then X-Forwarded-For is not.
        let mut h = headers(
            "forwarded",
            &["for=9.9.9.9", "for=\"[2001:db8::7]\";proto=https"],
        );
        h.append("x-forwarded-for", "8.8.8.8".parse().unwrap());
        assert_eq!(
            client(ip("127.0.0.1"), &h, &trusted, ProxyHeader::Forwarded),
            ip("2001:db8::7")
        );
        assert_eq!(client(ip("127.0.0.1"), &h, &trusted, xff), ip("8.8.8.8"));
        // Nothing trusted: the peer.
        assert_eq!(client(ip("127.0.0.1"), &h, &[], xff), ip("127.0.0.1"));
    }

    #[test]
    fn ipv6_counts_by_its_64() {
        assert_eq!(
            source_key(ip("2001:db8:1:2:aaaa::1")),
            source_key(ip("2001:db8:1:2:ffff:1:2:3"))
        );
        assert_eq!(source_key(ip("2001:db8:1:2::9")), "2001:db8:1:2::/64");
        assert_ne!(
            source_key(ip("2001:db8:1:2::1")),
            source_key(ip("2001:db8:1:3::1"))
        );
        assert_eq!(source_key(ip("::ffff:192.0.2.1")), "192.0.2.1");
        assert_eq!(source_key(ip("192.0.2.1")), "192.0.2.1");
    }
}
