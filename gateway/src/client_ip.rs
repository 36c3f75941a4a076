//! Whose request it is, for the per-IP limit. The peer address, unless the
//! peer is a trusted proxy (`BOXOFFICE_TRUSTED_PROXIES`, CIDRs): then the
//! client is the rightmost address of the header those proxies write
//! (`BOXOFFICE_FORWARDED_HEADER`: `X-Forwarded-For` by default, or
//! `Forwarded`, RFC 7239; never the other one) that is not itself a trusted
//! proxy. The headers
//! are never read from anyone else, so a client cannot pick its own key by
//! sending them. IPv6 clients are keyed by their /64 (one host commonly has
//! a whole one); IPv4-mapped IPv6 addresses as IPv4.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::http::{HeaderMap, HeaderName, Request};
use ipnet::IpNet;
use tower_governor::key_extractor::KeyExtractor;
use tower_governor::GovernorError;

#[derive(Clone, Debug, Default)]
pub struct ClientIp {
    trusted: Arc<[IpNet]>,
    header: ForwardedHeader,
}

/// The key of an address: IPv4 as is, IPv6 by its /64.
pub fn key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        },
    }
}

/// One hop of `Forwarded: for=…` or `X-Forwarded-For`, with or without a
/// port, IPv6 in brackets or not.
fn hop(text: &str) -> Option<IpAddr> {
    let text = text.trim().trim_matches('"');
    if let Ok(ip) = text.parse() {
        return Some(ip);
    }
    if let Some(rest) = text.strip_prefix('[') {
        return rest.split_once(']')?.0.parse().ok();
    }
    text.parse::<SocketAddr>().ok().map(|a| a.ip())
}

/// Which header the trusted proxies write the client's address into.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ForwardedHeader {
    /// `X-Forwarded-For` (nginx, HAProxy, cloud load balancers).
    #[default]
    XForwardedFor,
    /// `Forwarded: for=…` (RFC 7239).
    Forwarded,
}

/// The hops of the one header the proxies write, last (the nearest proxy's
/// peer) to first; `None` for one that cannot be read. The other header is
/// never read: a proxy that only appends to one passes the client's own copy
/// of the other through. Walked in place, nothing copied.
fn hops_nearest_first(
    headers: &HeaderMap,
    header: ForwardedHeader,
) -> impl Iterator<Item = Option<IpAddr>> + '_ {
    // Names made once: a `&'static str` is parsed again on each lookup.
    const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
    let name = match header {
        ForwardedHeader::XForwardedFor => X_FORWARDED_FOR,
        ForwardedHeader::Forwarded => axum::http::header::FORWARDED,
    };
    headers
        .get_all(name)
        .iter()
        .rev()
        .filter_map(|v| v.to_str().ok())
        // Not the `char` alone: its pattern searches with `memrchr`, whose
        // setup costs more than a header's few bytes.
        .flat_map(|v| v.rsplit([',']))
        .map(move |element| match header {
            ForwardedHeader::XForwardedFor => hop(element),
            // An element without `for=` names no client: unreadable.
            ForwardedHeader::Forwarded => element.split(';').find_map(|pair| {
                let (name, value) = pair.split_once('=')?;
                name.trim()
                    .eq_ignore_ascii_case("for")
                    .then(|| hop(value))?
            }),
        })
}

/// The client's key, found once per request by the outermost layer (see
/// [`crate::edge`]) and read by the limits after it.
#[derive(Clone, Copy, Debug)]
pub struct Client(pub IpAddr);

impl ClientIp {
    pub fn new(trusted: Vec<IpNet>, header: ForwardedHeader) -> Self {
        Self {
            trusted: trusted.into(),
            header,
        }
    }

    /// Whether `ip` is one of the trusted proxies. IPv4-mapped addresses (a
    /// dual-stack `[::]` listener sees IPv4 peers as `::ffff:a.b.c.d`) are
    /// checked as the IPv4 addresses they are.
    pub fn is_trusted(&self, ip: IpAddr) -> bool {
        let canonical = ip.to_canonical();
        self.trusted
            .iter()
            .any(|net| net.contains(&canonical) || (canonical != ip && net.contains(&ip)))
    }

    /// The key of the client behind `peer`.
    pub fn of(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        self.behind(peer, headers).0
    }

    /// The key of the client behind `peer`, and whether `peer` is a
    /// trusted proxy.
    pub fn behind(&self, peer: IpAddr, headers: &HeaderMap) -> (IpAddr, bool) {
        if !self.is_trusted(peer) {
            return (key(peer), false);
        }
        (self.past_proxies(peer, headers), true)
    }

    /// The client behind `peer`, a trusted proxy.
    fn past_proxies(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        // From the nearest hop outwards, past our own proxies.
        let mut client = peer;
        for hop in hops_nearest_first(headers, self.header) {
            match hop {
                Some(ip) if self.is_trusted(ip) => client = ip,
                Some(ip) => return key(ip),
                // Garbage from beyond our proxies: the last proxy that we
                // trust is the client we can name.
                None => break,
            }
        }
        key(client)
    }
}

impl KeyExtractor for ClientIp {
    type Key = IpAddr;

    fn extract<T>(&self, request: &Request<T>) -> Result<IpAddr, GovernorError> {
        if let Some(Client(client)) = request.extensions().get::<Client>() {
            return Ok(*client);
        }
        let peer = crate::Connection::peer_of(request)
            .map(|peer| peer.ip())
            .ok_or(GovernorError::UnableToExtractKey)?;
        Ok(self.of(peer, request.headers()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| (k.parse().unwrap(), v.parse().unwrap()))
            .collect()
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn forwarded_headers_count_only_from_trusted_proxies() {
        let proxies = ClientIp::new(
            vec!["10.0.0.0/8".parse().unwrap()],
            ForwardedHeader::XForwardedFor,
        );
        let spoofed = headers(&[("x-forwarded-for", "198.51.100.1")]);
        // Not from a proxy: the header is the client's own word, ignored.
        assert_eq!(proxies.of(ip("203.0.113.9"), &spoofed), ip("203.0.113.9"));
        assert_eq!(
            ClientIp::default().of(ip("10.1.1.1"), &spoofed),
            ip("10.1.1.1")
        );
        // From a proxy: the rightmost hop that is not one of ours.
        let chain = headers(&[("x-forwarded-for", "198.51.100.1, 203.0.113.7, 10.0.0.5")]);
        assert_eq!(proxies.of(ip("10.0.0.2"), &chain), ip("203.0.113.7"));
        // A client that prepends a fake hop does not move its key.
        let lying = headers(&[("x-forwarded-for", "1.2.3.4, 203.0.113.7")]);
        assert_eq!(proxies.of(ip("10.0.0.2"), &lying), ip("203.0.113.7"));
        // Several headers are one list, in order.
        let split = headers(&[
            ("x-forwarded-for", "198.51.100.1"),
            ("x-forwarded-for", "10.0.0.9"),
        ]);
        assert_eq!(proxies.of(ip("10.0.0.2"), &split), ip("198.51.100.1"));
        // Only proxies, or garbage past them: the outermost proxy we can name.
        let ours = headers(&[("x-forwarded-for", "10.0.0.7")]);
        assert_eq!(proxies.of(ip("10.0.0.2"), &ours), ip("10.0.0.7"));
        let garbage = headers(&[("x-forwarded-for", "not-an-ip, 10.0.0.7")]);
        assert_eq!(proxies.of(ip("10.0.0.2"), &garbage), ip("10.0.0.7"));
    }

    #[test]
    fn only_the_configured_header_is_read_in_its_forms() {
        let trusted = || vec!["10.0.0.0/8".parse().unwrap()];
        let both = headers(&[
            (
                "forwarded",
                "for=192.0.2.60;proto=https, for=\"[2001:db8:cafe:1::17]:4711\"",
            ),
            ("x-forwarded-for", "198.51.100.1"),
        ]);
        let xff = ClientIp::new(trusted(), ForwardedHeader::XForwardedFor);
        // A client's own `Forwarded` passed through an XFF proxy is ignored.
        assert_eq!(xff.of(ip("10.0.0.2"), &both), ip("198.51.100.1"));
        let forwarded = ClientIp::new(trusted(), ForwardedHeader::Forwarded);
        assert_eq!(forwarded.of(ip("10.0.0.2"), &both), ip("2001:db8:cafe:1::"));
        // An element without `for=` stops the walk at the proxy before it.
        let no_for = headers(&[("forwarded", "for=192.0.2.60, proto=https, for=10.0.0.7")]);
        assert_eq!(forwarded.of(ip("10.0.0.2"), &no_for), ip("10.0.0.7"));
        let with_port = headers(&[("x-forwarded-for", "203.0.113.7:5555")]);
        assert_eq!(xff.of(ip("10.0.0.2"), &with_port), ip("203.0.113.7"));
    }

    #[test]
    fn ipv6_clients_are_keyed_by_their_64() {
        assert_eq!(
            key(ip("2001:db8:1:2:aaaa::1")),
            key(ip("2001:db8:1:2:bbbb::9"))
        );
        assert_ne!(key(ip("2001:db8:1:2::1")), key(ip("2001:db8:1:3::1")));
        assert_eq!(key(ip("::ffff:192.0.2.1")), ip("192.0.2.1"));
    }

    #[test]
    fn a_proxy_seen_through_a_dual_stack_listener_is_still_trusted() {
        let proxies = ClientIp::new(
            vec!["10.0.0.0/8".parse().unwrap()],
            ForwardedHeader::XForwardedFor,
        );
        let chain = headers(&[("x-forwarded-for", "203.0.113.7, ::ffff:10.0.0.5")]);
        assert_eq!(proxies.of(ip("::ffff:10.0.0.2"), &chain), ip("203.0.113.7"));
        // A list written in the mapped form still matches.
        let mapped = ClientIp::new(
            vec!["::ffff:10.0.0.0/104".parse().unwrap()],
            ForwardedHeader::XForwardedFor,
        );
        assert_eq!(mapped.of(ip("::ffff:10.0.0.2"), &chain), ip("203.0.113.7"));
        // Hops that name no address (RFC 7239's `unknown`, an obfuscated
        // `_hidden`, a zone id) stop the walk at the last proxy we can name.
        for hidden in ["for=unknown", "for=_hidden", "for=\"[fe80::1%eth0]\""] {
            let forwarded = ClientIp::new(
                vec!["10.0.0.0/8".parse().unwrap()],
                ForwardedHeader::Forwarded,
            );
            let h = headers(&[("forwarded", &format!("{hidden}, for=10.0.0.7"))]);
            assert_eq!(forwarded.of(ip("10.0.0.2"), &h), ip("10.0.0.7"), "{hidden}");
        }
    }
}
